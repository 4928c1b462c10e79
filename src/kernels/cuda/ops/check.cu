// What every CUDA kernel file shares at run time.
#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(fmt::format("CUDA: {} failed: {}", what, cudaGetErrorString(status)));
}

}  // namespace meshtrain::kernels::cuda::ops
