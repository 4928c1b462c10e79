#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>

#include "core/copy.h"
#include "core/error.h"
#include "graph/op_registry.h"
#include "sharding/redistribute.h"

namespace meshtrain::runtime {

namespace {
CachingAllocator& allocator_of(Device device) {
  return device == Device::cuda ? kernels::cuda::device_allocator() : default_allocator();
}
}  // namespace

Executor::Executor(const graph::Graph& g, graph::Schedule schedule, sharding::MeshGroups* groups, Device device)
    : g_(g), schedule_(std::move(schedule)), groups_(groups), device_(device), arena_(nullptr, {nullptr}) {
  if (device_ == Device::cuda) stream_ = std::make_unique<kernels::cuda::Stream>();
  // Each step's kernel, FLOPs and bytes; every value it computes has a place.
  std::map<graph::NodeId, int> step_of;
  std::set<std::pair<std::vector<int>, sharding::CommStream>> group_streams;
  for (graph::NodeId n : schedule_.steps) {
    step_of[n] = static_cast<int>(step_of.size());
    const graph::Node& node = g.node(n);
    MT_CHECK(!node.removed, "schedule: step node {} ({}) was removed from the graph", n.index, node.op->name);
    if (node.op->is_collective) {
      MT_CHECK(device_ == Device::cpu, "node {} is a collective ({}): collectives run on the CPU only, for now",
               n.index, node.op->name);
      MT_CHECK(groups_ != nullptr, "node {} is a collective ({}) but the executor was given no mesh groups", n.index,
               node.op->name);
      step_collectives_.push_back(collective_step(node, groups_->mesh()));
      const sharding::PlanStep& s = step_collectives_.back()->step;
      group_streams.emplace(s.mesh_dims,
                            s.collective ? sharding::comm_stream(*s.collective) : sharding::CommStream::main);
    } else {
      step_collectives_.emplace_back();
    }
    started_by_.push_back(-1);
    if (node.op->is_wait) {
      const auto start = step_of.find(g.value(node.inputs[0]).producer);
      MT_CHECK(start != step_of.end() && g.node(start->first).op->is_collective,
               "schedule: wait node {} waits for {}, which is not a collective started before it", n.index,
               g.describe_value(node.inputs[0]));
      started_by_.back() = start->second;
    }
    const bool kernel_free = node.op->is_view || step_collectives_.back().has_value();
    const bool on_cpu = device_ == Device::cpu;
    const kernels::cpu::CpuKernel* kernel =
        kernel_free || !on_cpu ? nullptr : kernels::cpu::find_cpu_kernel(node.op->name);
    const kernels::cuda::CudaKernel* cuda_kernel =
        kernel_free || on_cpu ? nullptr : kernels::cuda::find_cuda_kernel(node.op->name);
    MT_CHECK(kernel_free || !on_cpu || kernel != nullptr,
             "op {} has no CPU kernel (attach one with register_cpu_kernel)", node.op->name);
    MT_CHECK(kernel_free || on_cpu || cuda_kernel != nullptr,
             "op {} has no CUDA kernel (attach one with register_cuda_kernel)", node.op->name);
    step_cuda_kernels_.push_back(cuda_kernel);
    for (graph::ValueId out : node.outputs)
      MT_CHECK(schedule_.memory.offsets.count(out) || schedule_.memory.view_of.count(out),
               "schedule: {} has no place in the memory plan", g.describe_value(out));
    step_kernels_.push_back(kernel);
    const graph::ValueInfos in = graph::value_infos(g, node.inputs), out = graph::value_infos(g, node.outputs);
    step_flops_.push_back(graph::op_flops(*node.op, in, out, node.attrs));
    step_bytes_.push_back(graph::op_bytes(*node.op, in, out, node.attrs));
  }
  // Groups over merged mesh dims, and further streams, are made collectively:
  // make them now, in the same order on every rank (sorted, whatever order
  // the schedule has).
  for (const auto& [dims, stream] : group_streams) groups_->merged_group(dims, stream);
  CachingAllocator& arena_allocator = allocator_of(device_);
  arena_ = std::unique_ptr<std::byte, FreeToAllocator>(
      static_cast<std::byte*>(arena_allocator.allocate(std::max<size_t>(schedule_.memory.peak_bytes, 1))),
      FreeToAllocator{&arena_allocator});
}

Executor::~Executor() {
  captured_.reset();
  if (stream_) stream_->synchronize();  // nothing in flight reads the arena when it goes
}

void Executor::bind(graph::ValueId value, Tensor tensor) {
  const graph::Value& v = g_.value(value);
  MT_CHECK(!v.producer.valid(), "bind: {} is computed by the graph, not an input", g_.describe_value(value));
  MT_CHECK(tensor.dtype() == v.info.dtype && tensor.shape() == v.info.shape, "bind: {} expects {}{}, got {}", v.name,
           dtype_name(v.info.dtype), v.info.shape.to_string(), tensor.describe());
  MT_CHECK(tensor.device() == device_, "bind: {} is on {}, the executor runs on {}", v.name,
           device_name(tensor.device()), device_name(device_));
  bound_[value] = std::move(tensor);
  run_ready_ = false;
}

bool Executor::is_fetched(graph::ValueId value) const {
  return std::find(schedule_.fetches.begin(), schedule_.fetches.end(), value) != schedule_.fetches.end();
}

Tensor Executor::tensor_of(graph::ValueId value) const {
  if (const graph::ValueId r = schedule_.memory.storage_of(value); r != value) {
    const Tensor storage = tensor_of(r);
    const graph::ValueInfo& info = g_.value(value).info;
    return Tensor::view(
        static_cast<std::byte*>(const_cast<void*>(storage.raw())) + schedule_.memory.offset_in_storage(value),
        info.shape, info.dtype, device_);
  }
  const graph::Value& v = g_.value(value);
  if (!v.producer.valid()) {
    auto it = bound_.find(value);
    MT_CHECK(it != bound_.end(), "run: {} has no tensor bound; bind every input and parameter first",
             g_.describe_value(value));
    return it->second;
  }
  auto it = schedule_.memory.offsets.find(value);
  MT_CHECK(it != schedule_.memory.offsets.end(), "{} is not computed by this executor's plan",
           g_.describe_value(value));
  return Tensor::view(arena_.get() + it->second, v.info.shape, v.info.dtype, device_);
}

void Executor::prepare_run() {
  size_t count = 0;
  for (graph::NodeId n : schedule_.steps) count += g_.node(n).inputs.size() + g_.node(n).outputs.size();
  step_tensors_.clear();
  step_tensors_.reserve(count);  // no reallocation below: kernel_args_ points into it
  kernel_args_.clear();
  kernel_args_.reserve(schedule_.steps.size());
  for (graph::NodeId n : schedule_.steps) {
    const graph::Node& node = g_.node(n);
    std::vector<const Tensor*> ins;
    std::vector<Tensor*> outs;
    for (graph::ValueId v : node.inputs) ins.push_back(&step_tensors_.emplace_back(tensor_of(v)));
    for (graph::ValueId v : node.outputs) outs.push_back(&step_tensors_.emplace_back(tensor_of(v)));
    kernel_args_.push_back(kernels::cpu::KernelArgs{std::move(ins), std::move(outs), node.attrs});
  }
  in_flight_.assign(schedule_.steps.size(), {});
  update_copies_.clear();
  for (const graph::Update& u : schedule_.updates) {
    if (schedule_.memory.storage_of(u.from) == u.to) continue;  // computed in place
    Tensor dst = tensor_of(u.to);
    update_copies_.push_back({dst.raw(), tensor_of(u.from).raw(), dst.nbytes()});
  }
  run_ready_ = true;
  captured_.reset();  // its launches read the old bindings
  runs_since_prepare_ = 0;
}

void Executor::run() {
  using Clock = std::chrono::steady_clock;
  if (!run_ready_) prepare_run();
  if (device_ == Device::cuda) return run_on_gpu();
  if (profiling_) {
    node_seconds_.resize(schedule_.steps.size(), 0.0);
    ++profiled_runs_;
  }
  const bool timing = profiling_ || tracing_;
  const auto run_begin = Clock::now();
  const auto us_since_begin = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - run_begin).count();
  };
  if (tracing_) {
    trace_.clear();
    trace_.reserve(schedule_.steps.size());
  }
  for (size_t step = 0; step < schedule_.steps.size(); ++step) {
    const auto& collective = step_collectives_[step];
    if (step_kernels_[step] == nullptr && !collective && started_by_[step] < 0) continue;  // a view: aliased
    const auto t0 = timing ? Clock::now() : Clock::time_point{};
    if (collective) {
      const kernels::cpu::KernelArgs& a = kernel_args_[step];
      std::optional<sharding::RaggedRows> ragged;
      if (collective->ragged_padding) ragged = sharding::RaggedRows{a.in[1], a.in[2], *collective->ragged_padding};
      in_flight_[step] =
          collective->ring_shift ? sharding::start_ring_shift(*a.in[0], *a.out[0], collective->step.mesh_dims[0],
                                                              *groups_, collective->ring_distance)
          : collective->member_blocks.empty()
              ? sharding::start_step(*a.in[0], *a.out[0], a.out.size() > 1 ? *a.out[1] : *a.out[0],
                                     collective->global_shape, collective->step, *groups_, ragged ? &*ragged : nullptr)
              : sharding::start_coalesced_step(*a.in[0], *a.out[0], collective->step, collective->member_blocks,
                                               *groups_);
      if (a.out.size() == 1) in_flight_[step].complete();  // shard_locally: nothing to wait for
    } else if (started_by_[step] >= 0) {
      in_flight_[static_cast<size_t>(started_by_[step])].complete();
    } else {
      (*step_kernels_[step])(kernel_args_[step]);
    }
    if (timing) {
      const auto t1 = Clock::now();
      if (profiling_) node_seconds_[step] += std::chrono::duration<double>(t1 - t0).count();
      if (tracing_) trace_.push_back({schedule_.steps[step], us_since_begin(t0), us_since_begin(t1)});
    }
  }
  for (const Copy& c : update_copies_) move_bytes(c.dst, c.src, c.bytes);  // src may be a view of dst
}

// The first run after a bind runs its launches as they come (warming up
// cuBLASLt's choices and anything made on first use); the second is
// captured as a CUDA graph, and it and every later run replay it.
// Profiling times each step between CUDA events, so it runs uncaptured.
void Executor::run_on_gpu() {
  MT_CHECK(!tracing_, "tracing a GPU step is not there yet");
  if (profiling_) return profile_on_gpu();
  if (cuda_graphs_ && runs_since_prepare_ >= 1 && !captured_) {
    try {
      auto graph = std::make_unique<kernels::cuda::CapturedGraph>(*stream_);
      launch_steps();  // captured, not run: a throw here ends the capture in the graph's destructor
      graph->end();
      captured_ = std::move(graph);
    } catch (const std::exception& e) {  // the step still runs, launch by launch: say so once
      std::fprintf(stderr, "meshtrain: warning: capturing the step as a CUDA graph failed (%s); it runs uncaptured\n",
                   e.what());
      cuda_graphs_ = false;
    }
  }
  if (captured_)
    captured_->launch(*stream_);
  else
    launch_steps();
  stream_->synchronize();
  ++runs_since_prepare_;
}

void Executor::profile_on_gpu() {
  node_seconds_.resize(schedule_.steps.size(), 0.0);
  ++profiled_runs_;
  if (step_events_.empty())
    for (size_t i = 0; i <= schedule_.steps.size(); ++i)
      step_events_.push_back(std::make_unique<kernels::cuda::Event>());
  launch_steps(true);
  stream_->synchronize();
  for (size_t step = 0; step < schedule_.steps.size(); ++step)
    node_seconds_[step] += 1e-3 * step_events_[step + 1]->ms_since(*step_events_[step]);
  ++runs_since_prepare_;
}

void Executor::launch_steps(bool timed) {
  const kernels::cuda::LaunchContext ctx = kernels::cuda::launch_context(*stream_);
  for (size_t step = 0; step < schedule_.steps.size(); ++step) {
    if (timed) step_events_[step]->record(*stream_);
    if (step_cuda_kernels_[step] != nullptr) (*step_cuda_kernels_[step])(kernel_args_[step], ctx);
  }
  if (timed) step_events_.back()->record(*stream_);
  for (const Copy& c : update_copies_)
    if (c.dst != c.src) kernels::cuda::copy_bytes(c.dst, c.src, c.bytes, *stream_);
}

double Executor::flops() const { return std::accumulate(step_flops_.begin(), step_flops_.end(), 0.0); }
double Executor::bytes() const { return std::accumulate(step_bytes_.begin(), step_bytes_.end(), 0.0); }

std::vector<Executor::OpTime> Executor::profile() const {
  std::map<std::string, OpTime> by_op;
  for (size_t step = 0; step < node_seconds_.size(); ++step) {
    const graph::Node& node = g_.node(schedule_.steps[step]);
    if (node.op->is_view && !node.op->is_wait) continue;  // never run, so never timed
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

Tensor Executor::fetch(graph::ValueId value) const {
  MT_CHECK(is_fetched(value) || !g_.value(value).producer.valid(),
           "fetch: {} was not requested when the executor was built", g_.describe_value(value));
  return tensor_of(value);
}

}  // namespace meshtrain::runtime
