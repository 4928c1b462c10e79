// CUDA kernels attached to graph ops by name, as the CPU kernels are: each
// op family's kernels are in kernels/cuda/ops/<family>.cu, mirroring
// graph/ops/. A kernel launches on the context's stream and returns without
// synchronizing or allocating, so a step's launches can be captured into a
// CUDA graph. Takes f32 and bf16 (computed in f32, as the CPU kernels do).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "kernels/cuda/cuda.h"
#include "kernels/kernel_args.h"

namespace meshtrain::kernels::cuda {

// What a kernel launches with (CUDA types as void*, so that this header
// needs no CUDA headers).
struct LaunchContext {
  void* stream = nullptr;     // cudaStream_t
  void* cublaslt = nullptr;   // cublasLtHandle_t
  void* workspace = nullptr;  // cuBLASLt's workspace, workspace_bytes long
  size_t workspace_bytes = 0;
  void* scratch = nullptr;  // device scratch a kernel may use during its launch, scratch_bytes long
  size_t scratch_bytes = 0;
  bool allow_tf32 = false;  // f32 GEMMs may run on TF32 tensor cores
};

using CudaKernel = std::function<void(const KernelArgs& args, const LaunchContext& ctx)>;

// The CUDA kernel of an op, or nullptr when it has none (none at all in a
// build without CUDA).
const CudaKernel* find_cuda_kernel(const std::string& op);
void register_cuda_kernel(const std::string& op, CudaKernel kernel);

// A context on `stream` with this process's cuBLASLt handle, workspace and
// scratch (made on first use; they live as long as the process).
LaunchContext launch_context(const Stream& stream, bool allow_tf32 = false);

}  // namespace meshtrain::kernels::cuda
