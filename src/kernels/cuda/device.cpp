// The CUDA runtime side of kernels/cuda/cuda.h and the launch context of
// op_kernels.h (built with the CUDA backend only; no_cuda.cpp otherwise).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/op_kernels.h"

namespace meshtrain::kernels::cuda {

namespace {

struct Probe {
  std::optional<GpuInfo> info;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      r.reason = fmt::format("CUDA finds no usable GPU ({})", cudaGetErrorString(e));
      cudaGetLastError();
      return r;
    }
    if (count == 0) {
      r.reason = "CUDA finds no GPU";
      return r;
    }
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    GpuInfo g;
    g.index = 0;
    g.name = prop.name;
    g.major = prop.major;
    g.minor = prop.minor;
    g.multiprocessors = prop.multiProcessorCount;
    g.memory_bytes = prop.totalGlobalMem;
    cudaDriverGetVersion(&g.driver_version);
    cudaRuntimeGetVersion(&g.runtime_version);
    r.info = g;
    return r;
  }();
  return p;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free out-of-memory error
    return nullptr;
  }
  return p;
}
void device_free(void* p) { cudaFree(p); }
void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}
void pinned_free(void* p) { cudaFreeHost(p); }

cudaMemcpyKind kind_of(Device dst, Device src) {
  if (dst == Device::cuda) return src == Device::cuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  return src == Device::cuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

}  // namespace

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(fmt::format("CUDA: {} failed: {}", what, cudaGetErrorString(status)));
}

bool built_with_cuda() { return true; }

std::string GpuInfo::describe() const {
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", name, major, minor, multiprocessors,
                     static_cast<double>(memory_bytes) / (1ull << 30));
}

std::optional<GpuInfo> gpu() { return probe().info; }
std::string no_gpu_reason() { return probe().info ? "" : probe().reason; }

const GpuInfo& require_gpu() {
  const Probe& p = probe();
  MT_CHECK(p.info.has_value(), "no GPU: {}", p.reason);
  return *p.info;
}

CachingAllocator& device_allocator() {
  static auto* a = [] {
    require_gpu();
    return new CachingAllocator(MemorySource{Device::cuda, "GPU", device_alloc, device_free});
  }();
  return *a;
}

CachingAllocator& pinned_allocator() {
  static auto* a = [] {
    require_gpu();
    return new CachingAllocator(MemorySource{Device::cpu, "pinned host", pinned_alloc, pinned_free});
  }();
  return *a;
}

Stream::Stream() {
  require_gpu();
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  handle_ = s;
}

Stream::~Stream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

void Stream::synchronize() const {
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)),
             "a kernel on the stream (cudaStreamSynchronize)");
}

Event::Event() {
  require_gpu();
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  handle_ = e;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::record(const Stream& stream) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle())),
             "cudaEventRecord");
}

float Event::ms_since(const Event& start) const {
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(handle_)),
             "cudaEventElapsedTime");
  return ms;
}

void copy(Tensor& dst, const Tensor& src, const Stream& stream) {
  MT_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy: {} into {}", src.describe(),
           dst.describe());
  check_cuda(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), kind_of(dst.device(), src.device()),
                             static_cast<cudaStream_t>(stream.handle())),
             "cudaMemcpyAsync");
}

void copy_bytes(void* dst, const void* src, size_t bytes, const Stream& stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream.handle())),
             "cudaMemcpyAsync");
}

CapturedGraph::CapturedGraph(const Stream& stream) : capturing_(stream) {
  check_cuda(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream.handle()), cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
}

void CapturedGraph::end() {
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(static_cast<cudaStream_t>(capturing_.handle()), &graph), "cudaStreamEndCapture");
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  exec_ = exec;
}

CapturedGraph::~CapturedGraph() {
  if (graph_ == nullptr) {  // still capturing: a launch threw
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(static_cast<cudaStream_t>(capturing_.handle()), &partial) == cudaSuccess && partial)
      cudaGraphDestroy(partial);
    cudaGetLastError();
    return;
  }
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void CapturedGraph::launch(const Stream& stream) const {
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream.handle())),
             "cudaGraphLaunch");
}

void fill_zero(Tensor& t, const Stream& stream) {
  if (t.device() == Device::cpu) {
    stream.synchronize();
    std::memset(t.raw(), 0, t.nbytes());
    return;
  }
  check_cuda(cudaMemsetAsync(t.raw(), 0, t.nbytes(), static_cast<cudaStream_t>(stream.handle())), "cudaMemsetAsync");
}

Tensor to_device(const Tensor& host) {
  MT_CHECK(host.device() == Device::cpu, "to_device: {} is already on the GPU", host.describe());
  Tensor d = Tensor::empty(host.shape(), host.dtype(), device_allocator());
  check_cuda(cudaMemcpy(d.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
  return d;
}

Tensor to_host(const Tensor& device) {
  MT_CHECK(device.device() == Device::cuda, "to_host: {} is not on the GPU", device.describe());
  Tensor h = Tensor::empty(device.shape(), device.dtype());
  check_cuda(cudaMemcpy(h.raw(), device.raw(), device.nbytes(), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return h;
}

LaunchContext launch_context(const Stream& stream, bool allow_tf32) {
  struct Shared {
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    void* scratch = nullptr;
  };
  static constexpr size_t kWorkspaceBytes = 32u << 20, kScratchBytes = 64u << 20;
  static Shared* shared = [] {
    auto* s = new Shared;  // never destroyed: kernels may run during static destruction
    if (cublasLtCreate(&s->lt) != CUBLAS_STATUS_SUCCESS) throw Error("cuBLASLt: cublasLtCreate failed");
    check_cuda(cudaMalloc(&s->workspace, kWorkspaceBytes), "cudaMalloc of cuBLASLt's workspace");
    check_cuda(cudaMalloc(&s->scratch, kScratchBytes), "cudaMalloc of the kernels' scratch");
    return s;
  }();
  return LaunchContext{stream.handle(), shared->lt,    shared->workspace, kWorkspaceBytes,
                       shared->scratch, kScratchBytes, allow_tf32};
}

}  // namespace meshtrain::kernels::cuda
