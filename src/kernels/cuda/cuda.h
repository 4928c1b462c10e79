// The CUDA device this process uses: whether meshtrain was built with CUDA
// and a GPU is there, its memory (a caching device allocator with the host
// one's statistics, pinned host memory), streams and copies. The header
// needs no CUDA headers; without CUDA in the build, gpu() says so and the
// rest throws.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/allocator.h"
#include "core/tensor.h"

namespace meshtrain::kernels::cuda {

// Whether this build has the CUDA backend (MESHTRAIN_CUDA).
bool built_with_cuda();

struct GpuInfo {
  int index = 0;  // the CUDA device ordinal
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  size_t memory_bytes = 0;
  int driver_version = 0, runtime_version = 0;  // as CUDA reports them: 13000 is 13.0
  std::string describe() const;                 // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
};
// The GPU this process uses (device 0 of those CUDA_VISIBLE_DEVICES shows),
// or nullopt with no_gpu_reason() saying why there is none.
std::optional<GpuInfo> gpu();
std::string no_gpu_reason();
// Throws InvalidArgument naming no_gpu_reason() when there is no GPU.
const GpuInfo& require_gpu();

CachingAllocator& device_allocator();  // cudaMalloc'd blocks, cached
CachingAllocator& pinned_allocator();  // page-locked host memory, for asynchronous copies

// An owned CUDA stream.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return handle_; }  // a cudaStream_t
  void synchronize() const;

 private:
  void* handle_ = nullptr;
};

// A point on a stream's timeline, for timing the kernels between two.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  // Milliseconds from `start` to this event, both recorded and done.
  float ms_since(const Event& start) const;

 private:
  void* handle_ = nullptr;  // a cudaEvent_t
};

// A stream's launches captured as a CUDA graph (begun at construction,
// ended by end()), replayed with launch().
class CapturedGraph {
 public:
  explicit CapturedGraph(const Stream& stream);  // begins capturing the stream's launches
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void end();  // ends the capture and instantiates the graph
  void launch(const Stream& stream) const;

 private:
  const Stream& capturing_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// dst = src, same dtype and shape, either on either device; asynchronous on
// the stream (truly so where the host side is pinned).
void copy(Tensor& dst, const Tensor& src, const Stream& stream);
void copy_bytes(void* dst, const void* src, size_t bytes, const Stream& stream);  // device to device
void fill_zero(Tensor& t, const Stream& stream);
// Synchronous helpers: a new tensor on the other side.
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& device);

}  // namespace meshtrain::kernels::cuda
