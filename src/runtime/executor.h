// Runs a graph on the CPU or on the GPU by following a Schedule (made by
// sched/): its steps in order, each intermediate at its planned offset of
// one arena of the planned size (host or device memory), allocated once, so
// a single-rank steady-state run allocates nothing. On the GPU the kernels
// launch on one stream, and from the second run on a run replays the first
// one's launches captured as a CUDA graph (profiling times each kernel
// between CUDA events, uncaptured). A lowered (per-rank) graph's
// collective nodes run on the mesh groups given (CPU only, for now): each
// collective starts where it is in the schedule and is completed by its
// wait node, so kernels run while it is in flight.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "graph/schedule.h"
#include "kernels/cpu/op_kernels.h"
#include "kernels/cuda/op_kernels.h"
#include "runtime/collectives.h"
#include "sharding/device_mesh.h"
#include "sharding/redistribute.h"

namespace meshtrain::runtime {

class Executor {
 public:
  // Checks that every step has a kernel for `device` (or is a collective,
  // when `groups` is given) and every value a step computes has its place in
  // the plan; allocates the arena. `groups` must outlive the executor.
  Executor(const graph::Graph& g, graph::Schedule schedule, sharding::MeshGroups* groups = nullptr,
           Device device = Device::cpu);
  ~Executor();

  // Inputs and parameters: the tensor is used in place (shape, dtype and
  // device checked). A run leaves the schedule's updates in the tensors
  // bound to their `to` (written there in place, or copied after the run).
  void bind(graph::ValueId value, Tensor tensor);
  // On the GPU, run() returns once the step has finished (its errors raised).
  void run();
  Device device() const { return device_; }
  // GPU: replay the captured step from the second run on (default on).
  void set_cuda_graphs(bool on) { cuda_graphs_ = on; }
  bool replaying_cuda_graph() const { return captured_ != nullptr; }  // the last run replayed the captured step
  // A fetched value after run(): a view into the arena (valid until the next run) or the bound tensor.
  Tensor fetch(graph::ValueId value) const;

  size_t arena_bytes() const { return schedule_.memory.peak_bytes; }  // the arena it allocated
  double flops() const;  // floating-point operations of one run, from each op's FLOP rule
  double bytes() const;  // bytes read and written by one run's kernels, from each op's byte rule
  size_t num_steps() const { return schedule_.steps.size(); }
  const graph::Schedule& schedule() const { return schedule_; }

  // Per-op wall time, summed over the runs made while profiling is on.
  struct OpTime {
    std::string op;
    int64_t calls = 0;
    double seconds = 0, flops = 0, bytes = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<OpTime> profile() const;  // slowest op first

  // The timeline of the last run made while tracing is on: every step that
  // ran (views excluded), in order, from the steady clock (microseconds
  // since the run began). A collective's start and its wait are steps of
  // their own: the collective is in flight from the one to the other.
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<graph::NodeSpan>& trace() const { return trace_; }

 private:
  Tensor tensor_of(graph::ValueId value) const;
  bool is_fetched(graph::ValueId value) const;

  const graph::Graph& g_;
  graph::Schedule schedule_;
  std::vector<double> step_flops_, step_bytes_;  // per step
  std::map<graph::ValueId, Tensor> bound_;       // inputs and parameters
  // What a run needs, built on the first run after a bind and kept, so that
  // a steady-state run creates no tensors and no vectors: per step its
  // kernel's arguments (over step_tensors_), and the copies of the updates
  // not made in place.
  void prepare_run();
  bool run_ready_ = false;
  std::vector<Tensor> step_tensors_;
  std::vector<const kernels::cpu::CpuKernel*> step_kernels_;  // per step; nullptr for views and collectives (CPU)
  std::vector<const kernels::cuda::CudaKernel*> step_cuda_kernels_;  // per step; nullptr for views (GPU)
  std::vector<std::optional<CollectiveStep>> step_collectives_;      // per step
  std::vector<int> started_by_;  // per step: for a wait, the step that started its collective; else -1
  std::vector<sharding::InFlightStep> in_flight_;  // per collective step: started, not yet waited for
  sharding::MeshGroups* groups_ = nullptr;
  std::vector<kernels::cpu::KernelArgs> kernel_args_;  // per step; unused for views
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<Copy> update_copies_;
  void run_on_gpu();
  void profile_on_gpu();
  // The GPU's kernel launches and update copies, on stream_; `timed`: an
  // event recorded before each step and after the last.
  void launch_steps(bool timed = false);
  std::vector<std::unique_ptr<kernels::cuda::Event>> step_events_;  // profiling on the GPU
  Device device_ = Device::cpu;
  bool cuda_graphs_ = true;
  std::unique_ptr<kernels::cuda::Stream> stream_;           // GPU only
  std::unique_ptr<kernels::cuda::CapturedGraph> captured_;  // the replayed step, once captured
  int64_t runs_since_prepare_ = 0;
  bool profiling_ = false;
  bool tracing_ = false;
  std::vector<graph::NodeSpan> trace_;
  std::vector<double> node_seconds_;  // per step, while profiling
  int64_t profiled_runs_ = 0;
  // The arena: one block of raw bytes from the device's allocator.
  struct FreeToAllocator {
    CachingAllocator* allocator;
    void operator()(std::byte* p) const { allocator->deallocate(p); }
  };
  std::unique_ptr<std::byte, FreeToAllocator> arena_;
};

}  // namespace meshtrain::runtime
