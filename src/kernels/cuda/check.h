// A CUDA runtime call's status as meshtrain::Error, for the code that
// calls CUDA itself (device.cpp, the kernel files).
#pragma once

#include <cuda_runtime_api.h>

namespace meshtrain::kernels::cuda {

// Throws meshtrain::Error naming the call and CUDA's message when `status` is not success.
void check_cuda(cudaError_t status, const char* what);

}  // namespace meshtrain::kernels::cuda
