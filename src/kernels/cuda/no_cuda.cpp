// kernels/cuda/cuda.h and op_kernels.h in a build without the CUDA backend:
// no GPU, no kernels, and a clear error for anything that needs one.
#include "core/error.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/op_kernels.h"

namespace meshtrain::kernels::cuda {

namespace {
[[noreturn]] void no_cuda() { throw InvalidArgument("no GPU: " + no_gpu_reason()); }
}  // namespace

bool built_with_cuda() { return false; }
std::string GpuInfo::describe() const { return name; }
std::optional<GpuInfo> gpu() { return std::nullopt; }
std::string no_gpu_reason() {
  return "this meshtrain was built without CUDA (configure with -DMESHTRAIN_CUDA=ON where the CUDA toolkit is)";
}
const GpuInfo& require_gpu() { no_cuda(); }
CachingAllocator& device_allocator() { no_cuda(); }
CachingAllocator& pinned_allocator() { no_cuda(); }
Stream::Stream() { no_cuda(); }
Stream::~Stream() = default;
void Stream::synchronize() const { no_cuda(); }
void copy(Tensor&, const Tensor&, const Stream&) { no_cuda(); }
void copy_bytes(void*, const void*, size_t, const Stream&) { no_cuda(); }
void fill_zero(Tensor&, const Stream&) { no_cuda(); }
Event::Event() { no_cuda(); }
Event::~Event() = default;
void Event::record(const Stream&) { no_cuda(); }
float Event::ms_since(const Event&) const { no_cuda(); }
CapturedGraph::CapturedGraph(const Stream& stream) : capturing_(stream) { no_cuda(); }
CapturedGraph::~CapturedGraph() = default;
void CapturedGraph::end() { no_cuda(); }
void CapturedGraph::launch(const Stream&) const { no_cuda(); }
Tensor to_device(const Tensor&) { no_cuda(); }
Tensor to_host(const Tensor&) { no_cuda(); }

const CudaKernel* find_cuda_kernel(const std::string&) { return nullptr; }
void register_cuda_kernel(const std::string&, CudaKernel) { no_cuda(); }
LaunchContext launch_context(const Stream&, bool) { no_cuda(); }

}  // namespace meshtrain::kernels::cuda
