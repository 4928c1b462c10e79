# The source files of the modules that the fuzz build (fuzz/CMakeLists.txt)
# compiles too, listed once, relative to src/: src/CMakeLists.txt builds
# its modules from these lists, the fuzz build its fuzz_core, fuzz_comm and
# fuzz_sharding libraries. A file added to one of these modules is added
# here, and both builds get it.
set(meshtrain_core_sources
  core/dtype.cpp
  core/shape.cpp
  core/tensor.cpp
  core/allocator.cpp
  core/file_io.cpp
  core/copy.cpp
)
set(meshtrain_comm_sources
  comm/types.cpp
  comm/reduce.cpp
  comm/work.cpp
  comm/process_group.cpp
  comm/flight_recorder.cpp
  comm/fr_analyze.cpp
  comm/local_backend.cpp
  comm/mpi_backend.cpp
  comm/mpi_plans.cpp
  comm/mpi_first_stage.cpp
  comm/mpi_shm.cpp
)
set(meshtrain_sharding_sources
  sharding/layout.cpp
  sharding/device_mesh.cpp
  sharding/local_chunk.cpp
  sharding/cost_model.cpp
  sharding/planner.cpp
  sharding/redistribute.cpp
)
