#include "train/kernel_benchmark.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "graph/op_registry.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::train {

namespace {

bool measurable(const graph::Node& node) {
  return !node.op->is_view && !node.op->is_collective && kernels::cpu::find_cpu_kernel(node.op->name) != nullptr;
}

Tensor filled(const graph::ValueInfo& info, uint64_t& state) {
  if (!is_floating(info.dtype)) {  // token ids, targets, the step count: 1 is valid for each
    Tensor ones = Tensor::empty(info.shape, DType::f32);
    std::fill(ones.data<float>().begin(), ones.data<float>().end(), 1.0f);
    return ones.to(info.dtype);
  }
  Tensor t = Tensor::empty(info.shape, DType::f32);
  for (float& x : t.data<float>()) {  // a linear congruential sequence: cheap, and no two values alike in a row
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = 0.25f + 0.5f * static_cast<float>(state >> 40) / static_cast<float>(1ull << 24);
  }
  return info.dtype == DType::f32 ? t : t.to(info.dtype);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

std::vector<std::string> measurable_kernels(const graph::Graph& g) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (graph::NodeId n : g.order())
    if (measurable(g.node(n)))
      if (std::string key = sched::kernel_key(g, n); seen.insert(key).second) keys.push_back(std::move(key));
  return keys;
}

KernelBenchmark measure_kernels(const graph::Graph& g, sched::KernelTimes& times, const KernelTiming& timing) {
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  KernelBenchmark result;
  std::set<std::string> done;
  uint64_t state = 1;
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    if (!measurable(node)) continue;
    std::string key = sched::kernel_key(g, n);
    if (!done.insert(key).second) continue;
    if (times.find(key)) {
      ++result.known;
      continue;
    }
    std::vector<Tensor> inputs, outputs;
    for (graph::ValueId v : node.inputs) inputs.push_back(filled(g.value(v).info, state));
    for (graph::ValueId v : node.outputs) outputs.push_back(Tensor::zeros(g.value(v).info.shape, g.value(v).info.dtype));
    kernels::cpu::KernelArgs args{{}, {}, node.attrs};
    for (const Tensor& t : inputs) args.in.push_back(&t);
    for (Tensor& t : outputs) args.out.push_back(&t);
    const kernels::cpu::CpuKernel& kernel = *kernels::cpu::find_cpu_kernel(node.op->name);
    try {
      kernel(args);  // warm-up: first-touch pages, caches, library set-up
      int calls = 0;
      const auto start = Clock::now();
      for (; calls < 3 || Clock::now() - start < timing.window; ++calls) kernel(args);
      times.us[key] = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls * timing.slowdown;
    } catch (const std::exception& e) {
      throw Error(fmt::format("benchmark mode: timing {} failed: {}", key, e.what()));
    }
    ++result.measured;
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  return result;
}

void align_kernel_times(sched::KernelTimes& times, const std::vector<std::string>& keys, comm::ProcessGroup& world) {
  // Entries as f64 pairs (the key's hash, bit for bit, and its time): an
  // all_gather moves bytes, so the hashes arrive unchanged.
  std::vector<double> mine;
  for (const std::string& key : keys) {
    const auto us = times.find(key);
    MT_CHECK(us.has_value(), "align_kernel_times: {} was not measured", key);
    const uint64_t hash = sched::kernel_key_hash(key);
    double bits;
    std::memcpy(&bits, &hash, sizeof bits);
    mine.push_back(bits);
    mine.push_back(*us);
  }
  Tensor count = Tensor::empty({1}, DType::f64);
  count.data<double>()[0] = static_cast<double>(keys.size());
  world.all_reduce(count, comm::ReduceOp::max)->wait();
  const auto most = static_cast<int64_t>(count.data<double>()[0]);
  Tensor entries = Tensor::empty({2 * most}, DType::f64);
  std::fill(entries.data<double>().begin(), entries.data<double>().end(), -1.0);  // padding: time -1
  std::copy(mine.begin(), mine.end(), entries.data<double>().begin());
  Tensor all = Tensor::empty({world.size() * 2 * most}, DType::f64);
  world.all_gather(entries, all)->wait();
  std::map<uint64_t, std::vector<double>> by_hash;
  const std::span<const double> row = std::as_const(all).data<double>();
  for (size_t i = 0; i + 1 < row.size(); i += 2) {
    if (row[i + 1] < 0) continue;
    uint64_t hash;
    std::memcpy(&hash, &row[i], sizeof hash);
    by_hash[hash].push_back(row[i + 1]);
  }
  for (const std::string& key : keys) times.us[key] = median_of(by_hash.at(sched::kernel_key_hash(key)));
}

}  // namespace meshtrain::train
