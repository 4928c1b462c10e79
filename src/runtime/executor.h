// Runs a graph on the CPU. Memory is planned once, statically, from value
// lifetimes: every intermediate gets a slot in one arena, reused after its
// last use, so a steady-state run allocates nothing.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::runtime {

class Executor {
 public:
  // Plans the nodes that `fetches` need, in graph order, and their memory.
  Executor(const graph::Graph& g, std::vector<int> fetches);

  // Inputs and parameters: the tensor is used in place (shape and dtype checked).
  void bind(int value, Tensor tensor);
  // After each run, copy computed value `from` into the tensor bound to
  // `to` (a parameter or optimizer state updated by the step). `from` must
  // be among the fetches.
  void write_back(int from, int to);
  void run();
  // A fetched value after run(): a view into the arena (valid until the next run) or the bound tensor.
  Tensor fetch(int value) const;

  size_t arena_bytes() const { return arena_bytes_; }  // the plan's peak intermediate memory
  double flops() const;  // floating-point operations of one run, from each op's FLOP rule
  double bytes() const;  // bytes read and written by one run's kernels, from each op's byte rule
  size_t num_steps() const { return order_.size(); }

  // Per-op wall time, summed over the runs made while profiling is on.
  struct OpTime {
    std::string op;
    int64_t calls = 0;
    double seconds = 0, flops = 0, bytes = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<OpTime> profile() const;  // slowest op first

 private:
  Tensor tensor_of(int value) const;
  int root(int value) const;  // the value whose storage `value` uses (itself unless a view)

  const graph::Graph& g_;
  std::vector<int> fetches_;
  std::vector<int> order_;               // node ids to run
  std::vector<double> step_flops_, step_bytes_;  // per step of order_
  std::map<int, size_t> offset_;         // intermediate value -> arena offset
  std::map<int, int> alias_;             // view value -> root value whose storage it shares
  std::map<int, Tensor> bound_;          // inputs and parameters
  std::vector<std::pair<int, int>> write_backs_;
  // What a run needs, built on the first run after a bind and kept, so that
  // a steady-state run creates no tensors and no vectors: per step of
  // order_ its kernel's arguments (over step_tensors_), and the write-backs.
  void prepare_run();
  bool run_ready_ = false;
  std::vector<Tensor> step_tensors_;
  std::vector<const kernels::cpu::CpuKernel*> step_kernels_;  // per step of order_; nullptr for views
  std::vector<kernels::cpu::KernelArgs> kernel_args_;  // per step; unused for views
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<Copy> write_back_copies_;
  bool profiling_ = false;
  std::vector<double> node_seconds_;  // per step of order_, while profiling
  int64_t profiled_runs_ = 0;
  size_t arena_bytes_ = 0;
  // The arena: one block of raw bytes from the default allocator.
  struct FreeToAllocator {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, FreeToAllocator> arena_;
};

}  // namespace meshtrain::runtime
