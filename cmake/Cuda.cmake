# The optional CUDA backend. MESHTRAIN_CUDA=AUTO (the default) builds it
# where CMake finds nvcc and a CUDA toolkit with cuBLASLt, and says in one
# line that it is skipped where it does not; ON requires it; OFF skips it.
# Sets MESHTRAIN_HAVE_CUDA, MESHTRAIN_CUDA_SOURCES (the kernels module's CUDA
# part, or its stand-in) and MESHTRAIN_CUDA_LIBS.
set(MESHTRAIN_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE MESHTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
# Ampere (sm_80) and Hopper (sm_90a) machine code, and PTX for newer GPUs.
set(MESHTRAIN_CUDA_ARCHITECTURES "80-real;90a-real;90-virtual" CACHE STRING "CUDA architectures of the GPU kernels")

set(MESHTRAIN_HAVE_CUDA OFF)
set(meshtrain_cuda_why "MESHTRAIN_CUDA=OFF")
if(NOT MESHTRAIN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(meshtrain_cuda_why "no CUDA compiler (nvcc) found")
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
    set(meshtrain_cuda_why "no CUDA toolkit with cuBLASLt found")
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublasLt AND TARGET CUDA::cudart)
      set(MESHTRAIN_HAVE_CUDA ON)
    endif()
  endif()
  if(NOT MESHTRAIN_HAVE_CUDA AND MESHTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON, but ${meshtrain_cuda_why}")
  endif()
endif()

if(MESHTRAIN_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${MESHTRAIN_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 dialect flag for nvcc 13: say what it is.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  # Imported targets that name /usr/include (fmt's, oneDNN's) must not put it
  # on nvcc's -isystem path: the C++ headers' #include_next <math.h> then fails.
  list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES ${CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES})
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  file(GLOB meshtrain_cuda_kernel_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/kernels/cuda/ops/*.cu)
  set(MESHTRAIN_CUDA_SOURCES kernels/cuda/device.cpp kernels/cuda/op_kernels.cpp ${meshtrain_cuda_kernel_files})
  set(MESHTRAIN_CUDA_LIBS CUDA::cudart CUDA::cublasLt)
  set(MESHTRAIN_FIND_CUDA "find_dependency(CUDAToolkit)")  # for meshtrainConfig.cmake
  message(STATUS "meshtrain: CUDA backend built (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${MESHTRAIN_CUDA_ARCHITECTURES})")
else()
  set(MESHTRAIN_CUDA_SOURCES kernels/cuda/no_cuda.cpp)
  set(MESHTRAIN_CUDA_LIBS "")
  set(MESHTRAIN_FIND_CUDA "")
  message(STATUS "meshtrain: CUDA backend skipped: ${meshtrain_cuda_why}")
endif()
