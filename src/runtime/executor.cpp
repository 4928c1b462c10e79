#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::runtime {

namespace {

constexpr size_t kAlign = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// First-fit over free ranges of the arena, growing it when nothing fits.
class ArenaPlanner {
 public:
  size_t allocate(size_t bytes) {
    bytes = std::max(aligned(bytes), kAlign);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const size_t offset = it->first;
      const size_t rest = it->second - bytes;
      free_.erase(it);
      if (rest) free_.emplace(offset + bytes, rest);
      return offset;
    }
    // Grow: reuse a free range that ends at the top of the arena.
    size_t offset = end_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == end_) {
        offset = last->first;
        free_.erase(last);
      }
    }
    end_ = offset + bytes;
    return offset;
  }
  void release(size_t offset, size_t bytes) {
    bytes = std::max(aligned(bytes), kAlign);
    auto [it, _] = free_.emplace(offset, bytes);
    // Coalesce with the neighbours.
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t size() const { return end_; }

 private:
  std::map<size_t, size_t> free_;  // offset -> bytes
  size_t end_ = 0;
};

size_t nbytes(const graph::ValueInfo& v) { return static_cast<size_t>(v.shape.numel()) * dtype_size(v.dtype); }

}  // namespace

Executor::Executor(const graph::Graph& g, std::vector<int> fetches) : g_(g), fetches_(std::move(fetches)) {
  // The nodes the fetches need.
  std::vector<bool> needed(static_cast<size_t>(g.num_nodes()), false);
  std::vector<int> stack;
  for (int v : fetches_) stack.push_back(v);
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    const int p = g.value(v).producer;
    if (p < 0 || needed[p]) continue;
    needed[p] = true;
    for (int in : g.node(p).inputs) stack.push_back(in);
  }
  for (int n = 0; n < g.num_nodes(); ++n)
    if (needed[n]) order_.push_back(n);
  // Each step's kernel, FLOPs and bytes (the plan never changes).
  for (int n : order_) {
    const graph::Node& node = g.node(n);
    const kernels::cpu::CpuKernel* kernel = node.op->is_view ? nullptr : kernels::cpu::find_cpu_kernel(node.op->name);
    MT_CHECK(node.op->is_view || kernel != nullptr, "op {} has no CPU kernel (attach one with register_cpu_kernel)",
             node.op->name);
    step_kernels_.push_back(kernel);
    std::vector<graph::ValueInfo> in, out;
    for (int v : node.inputs) in.push_back(g.value(v).info);
    for (int v : node.outputs) out.push_back(g.value(v).info);
    step_flops_.push_back(graph::op_flops(*node.op, in, out, node.attrs));
    step_bytes_.push_back(graph::op_bytes(*node.op, in, out, node.attrs));
  }
  // View ops (reshape) alias their input: a value's storage is its root's.
  for (int n : order_) {
    const graph::Node& node = g.node(n);
    if (node.op->is_view) alias_[node.outputs[0]] = root(node.inputs[0]);
  }
  // Last step that reads each root's storage; fetched storage lives to the end.
  std::map<int, size_t> last_use;
  for (size_t step = 0; step < order_.size(); ++step)
    for (int in : g.node(order_[step]).inputs) last_use[root(in)] = step;
  std::set<int> fetched;
  for (int v : fetches_) fetched.insert(root(v));
  ArenaPlanner arena;
  for (size_t step = 0; step < order_.size(); ++step) {
    const graph::Node& node = g.node(order_[step]);
    for (int out : node.outputs)
      if (!alias_.count(out)) offset_[out] = arena.allocate(nbytes(g.value(out).info));
    auto release_if_done = [&](int v) {
      if (g.value(v).producer < 0 || fetched.count(v)) return;
      auto it = last_use.find(v);
      if (it == last_use.end() || it->second == step) arena.release(offset_.at(v), nbytes(g.value(v).info));
    };
    std::set<int> seen;
    for (int in : node.inputs)
      if (seen.insert(root(in)).second) release_if_done(root(in));
    for (int out : node.outputs)
      if (!alias_.count(out) && !last_use.count(out)) release_if_done(out);  // produced but never read
  }
  arena_bytes_ = arena.size();
  arena_.reset(static_cast<std::byte*>(default_allocator().allocate(std::max<size_t>(arena_bytes_, 1))));
}

void Executor::FreeToAllocator::operator()(std::byte* p) const { default_allocator().deallocate(p); }

void Executor::bind(int value, Tensor tensor) {
  const graph::Value& v = g_.value(value);
  MT_CHECK(v.producer < 0, "bind: {} is computed by the graph, not an input", g_.describe_value(value));
  MT_CHECK(tensor.dtype() == v.info.dtype && tensor.shape() == v.info.shape, "bind: {} expects {}{}, got {}",
           v.name, dtype_name(v.info.dtype), v.info.shape.to_string(), tensor.describe());
  bound_[value] = std::move(tensor);
  run_ready_ = false;
}

void Executor::write_back(int from, int to) {
  MT_CHECK(std::find(fetches_.begin(), fetches_.end(), from) != fetches_.end(),
           "write_back: {} is not fetched by this executor", g_.describe_value(from));
  MT_CHECK(g_.value(to).producer < 0, "write_back: {} is not an input or parameter", g_.describe_value(to));
  MT_CHECK(g_.value(from).info == g_.value(to).info, "write_back: {} and {} differ in shape or dtype",
           g_.describe_value(from), g_.describe_value(to));
  write_backs_.emplace_back(from, to);
  run_ready_ = false;
}

int Executor::root(int value) const {
  auto it = alias_.find(value);
  return it == alias_.end() ? value : it->second;
}

Tensor Executor::tensor_of(int value) const {
  if (const int r = root(value); r != value) {
    const Tensor storage = tensor_of(r);
    const graph::ValueInfo& info = g_.value(value).info;
    return Tensor::view(const_cast<void*>(storage.raw()), info.shape, info.dtype);
  }
  const graph::Value& v = g_.value(value);
  if (v.producer < 0) {
    auto it = bound_.find(value);
    MT_CHECK(it != bound_.end(), "run: {} has no tensor bound; bind every input and parameter first",
             g_.describe_value(value));
    return it->second;
  }
  auto it = offset_.find(value);
  MT_CHECK(it != offset_.end(), "{} is not computed by this executor's plan", g_.describe_value(value));
  return Tensor::view(arena_.get() + it->second, v.info.shape,
                      v.info.dtype);
}

void Executor::prepare_run() {
  size_t count = 0;
  for (int n : order_) count += g_.node(n).inputs.size() + g_.node(n).outputs.size();
  step_tensors_.clear();
  step_tensors_.reserve(count);  // no reallocation below: kernel_args_ points into it
  kernel_args_.clear();
  kernel_args_.reserve(order_.size());
  for (int n : order_) {
    const graph::Node& node = g_.node(n);
    std::vector<const Tensor*> ins;
    std::vector<Tensor*> outs;
    for (int v : node.inputs) ins.push_back(&step_tensors_.emplace_back(tensor_of(v)));
    for (int v : node.outputs) outs.push_back(&step_tensors_.emplace_back(tensor_of(v)));
    kernel_args_.push_back(kernels::cpu::KernelArgs{std::move(ins), std::move(outs), node.attrs});
  }
  write_back_copies_.clear();
  for (const auto& [from, to] : write_backs_) {
    Tensor dst = tensor_of(to);
    write_back_copies_.push_back({dst.raw(), tensor_of(from).raw(), dst.nbytes()});
  }
  run_ready_ = true;
}

void Executor::run() {
  if (!run_ready_) prepare_run();
  if (profiling_) {
    node_seconds_.resize(order_.size(), 0.0);
    ++profiled_runs_;
  }
  for (size_t step = 0; step < order_.size(); ++step) {
    const graph::Node& node = g_.node(order_[step]);
    if (node.op->is_view) continue;  // aliased: nothing to compute
    const auto t0 = profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    (*step_kernels_[step])(kernel_args_[step]);
    if (profiling_)
      node_seconds_[step] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (const Copy& c : write_back_copies_) std::memmove(c.dst, c.src, c.bytes);  // src may be a view of dst
}

double Executor::flops() const { return std::accumulate(step_flops_.begin(), step_flops_.end(), 0.0); }
double Executor::bytes() const { return std::accumulate(step_bytes_.begin(), step_bytes_.end(), 0.0); }

std::vector<Executor::OpTime> Executor::profile() const {
  std::map<std::string, OpTime> by_op;
  for (size_t step = 0; step < node_seconds_.size(); ++step) {
    const graph::Node& node = g_.node(order_[step]);
    if (node.op->is_view) continue;  // never run, so never timed
    OpTime& t = by_op[node.op->name];
    t.op = node.op->name;
    t.calls += profiled_runs_;
    t.seconds += node_seconds_[step];
    t.flops += step_flops_[step] * static_cast<double>(profiled_runs_);
    t.bytes += step_bytes_[step] * static_cast<double>(profiled_runs_);
  }
  std::vector<OpTime> out;
  for (auto& [name, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

Tensor Executor::fetch(int value) const {
  MT_CHECK(std::find(fetches_.begin(), fetches_.end(), value) != fetches_.end() || g_.value(value).producer < 0,
           "fetch: {} was not requested when the executor was built", g_.describe_value(value));
  return tensor_of(value);
}

}  // namespace meshtrain::runtime
