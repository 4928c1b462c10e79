#include "estimate/kernel_benchmark.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include "compile/step.h"
#include "core/error.h"
#include "graph/op_registry.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::estimate {

namespace {

using Clock = std::chrono::steady_clock;

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

// One node's kernel on fresh tensors of its shapes, filled as `filled` fills them.
struct KernelCall {
  std::vector<Tensor> inputs, outputs;
  kernels::cpu::KernelArgs args;
  const kernels::cpu::CpuKernel* kernel;

  KernelCall(const graph::Graph& g, graph::NodeId n, uint64_t& state) : args{{}, {}, g.node(n).attrs} {
    const graph::Node& node = g.node(n);
    for (graph::ValueId v : node.inputs) inputs.push_back(filled(g.value(v).info, state));
    for (graph::ValueId v : node.outputs)
      outputs.push_back(Tensor::zeros(g.value(v).info.shape, g.value(v).info.dtype));
    for (const Tensor& t : inputs) args.in.push_back(&t);
    for (Tensor& t : outputs) args.out.push_back(&t);
    kernel = kernels::cpu::find_cpu_kernel(node.op->name);
  }
  KernelCall(const KernelCall&) = delete;  // args point into the vectors
  KernelCall& operator=(const KernelCall&) = delete;
  void operator()() { (*kernel)(args); }
};

// The mean wall time of the calls made until `window` has passed (at least `min_calls`).
double mean_call_us(KernelCall& call, std::chrono::microseconds window, int min_calls) {
  int calls = 0;
  const auto start = Clock::now();
  for (; calls < min_calls || Clock::now() - start < window; ++calls) call();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
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
    KernelCall call(g, n, state);
    try {
      call();  // warm-up: first-touch pages, caches, library set-up
      times.us[key] = mean_call_us(call, timing.window, 3) * timing.slowdown;
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

sched::SyncLateness measure_sync_lateness(const graph::Graph& g, const std::vector<std::vector<int64_t>>& groups,
                                          comm::ProcessGroup& world, const KernelTiming& timing, int windows) {
  MT_CHECK(windows > 0, "measure_sync_lateness: windows must be positive, got {}", windows);
  std::optional<graph::NodeId> heaviest;
  double most_flops = -1;
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    if (!measurable(node)) continue;
    const double flops =
        graph::op_flops(*node.op, graph::value_infos(g, node.inputs), graph::value_infos(g, node.outputs), node.attrs);
    if (flops > most_flops) {
      most_flops = flops;
      heaviest = n;
    }
  }
  // Windows end at fixed times after the barrier, alike on every rank, so
  // that window k of one rank runs beside window k of the others. Each holds
  // at least one call. After the windows, the rank's whole time.
  const auto slots = static_cast<size_t>(windows) + 1;
  Tensor mine = Tensor::zeros({static_cast<int64_t>(slots)}, DType::f64);
  std::string failure;
  if (heaviest) {
    try {
      uint64_t state = 1;
      KernelCall call(g, *heaviest, state);
      call();  // warm-up
      const std::span<double> out = mine.data<double>();
      const auto start = Clock::now();
      for (int w = 0; w < windows; ++w) {
        const auto window_start = Clock::now();
        int calls = 0;
        for (; calls < 1 || Clock::now() < start + (w + 1) * timing.window; ++calls) call();
        out[static_cast<size_t>(w)] =
            std::chrono::duration<double, std::micro>(Clock::now() - window_start).count() / calls;
      }
      out[slots - 1] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      failure =
          fmt::format("benchmark mode: timing {} side by side failed: {}", sched::kernel_key(g, *heaviest), e.what());
      mine.data<double>()[slots - 1] = -1;  // tells the others
    }
  }
  Tensor all = Tensor::empty({world.size() * static_cast<int64_t>(slots)}, DType::f64);
  wait_sleeping(world.all_gather(mine, all));  // a polling rank would take a core from one still timing
  MT_CHECK(failure.empty(), "{}", failure);
  const std::span<const double> gathered = std::as_const(all).data<double>();
  std::vector<double> per_rank;
  double whole_us = 0;
  for (int r = 0; r < world.size(); ++r) {
    const auto row = gathered.subspan(static_cast<size_t>(r) * slots, slots);
    MT_CHECK(row[slots - 1] >= 0, "benchmark mode: rank {} failed timing its kernel side by side", r);
    if (row[slots - 1] == 0) return {};  // a rank had no kernel to time: nothing to compare
    per_rank.insert(per_rank.end(), row.begin(), row.end() - 1);
    whole_us += row[slots - 1];
  }
  const double window_us = whole_us / world.size() / windows;
  return sync_lateness_of(per_rank, world.size(), windows, groups, window_us);
}

void wait_sleeping(const comm::WorkPtr& work) {
  while (!work->is_completed()) std::this_thread::sleep_for(std::chrono::microseconds(500));
  work->wait();  // its error, if it failed
}

sched::SyncLateness sync_lateness_of(std::span<const double> per_rank, int world_size, int windows,
                                     const std::vector<std::vector<int64_t>>& groups, double window_us) {
  MT_CHECK(windows > 0 && world_size > 0 && per_rank.size() == static_cast<size_t>(world_size) * windows,
           "sync_lateness_of: {} figures for {} ranks of {} windows", per_rank.size(), world_size, windows);
  for (const std::vector<int64_t>& group : groups) {
    MT_CHECK(!group.empty(), "sync_lateness_of: a group has no ranks");
    for (int64_t r : group)
      MT_CHECK(r >= 0 && r < world_size, "sync_lateness_of: rank {} is not in the world of {}", r, world_size);
  }
  // Stretches of 1, 2, 4, ... windows, each length at least 4 times in a
  // rank's windows (all of them where there are fewer than 4): per group
  // size, the slowest member's time less the group's mean, and the mean,
  // each summed.
  sched::SyncLateness lateness;
  for (int span = 1; span == 1 || span * 4 <= windows; span *= 2) {
    std::map<int64_t, std::array<double, 2>> sums;  // size -> trailing, mean
    for (const std::vector<int64_t>& group : groups) {
      std::array<double, 2>& sum = sums[static_cast<int64_t>(group.size())];
      for (int first = 0; first + span <= windows; first += span) {
        double slowest = 0, total = 0;
        for (int64_t r : group) {
          double us = 0;
          for (int w = first; w < first + span; ++w) us += per_rank[static_cast<size_t>(r * windows + w)];
          slowest = std::max(slowest, us);
          total += us;
        }
        const double mean = total / static_cast<double>(group.size());
        sum[0] += slowest - mean;
        sum[1] += mean;
      }
    }
    for (const auto& [size, sum] : sums)
      if (sum[1] > 0) lateness.tables[{world_size, size}].push_back({span * window_us, sum[0] / sum[1]});
  }
  return lateness;
}

namespace {

// Every group of each mesh dim of more than one rank, and the whole mesh
// where two or more dims are: the groups whose ranks wait for each other.
std::vector<std::vector<int64_t>> mesh_groups(const sharding::DeviceMesh& mesh) {
  std::vector<std::vector<int64_t>> groups;
  int split_dims = 0;
  for (int dim = 0; dim < mesh.ndim(); ++dim) {
    if (mesh.size(dim) == 1) continue;
    ++split_dims;
    for (int rank = 0; rank < mesh.num_ranks(); ++rank)
      if (mesh.coordinate(rank)[static_cast<size_t>(dim)] == 0) groups.push_back(mesh.group_ranks(rank, {dim}));
  }
  if (split_dims > 1) {
    std::vector<int> all(static_cast<size_t>(mesh.ndim()));
    std::iota(all.begin(), all.end(), 0);
    groups.push_back(mesh.group_ranks(0, all));
  }
  return groups;
}

}  // namespace

BenchmarkMode::BenchmarkMode(const config::TrainConfig& config, comm::ProcessGroupPtr world)
    : config_(config), world_(std::move(world)) {}

int BenchmarkMode::rank() const { return world_ ? world_->rank() : 0; }

void BenchmarkMode::save_cache() const {
  if (rank() == 0 && !config_.schedule.kernel_cache.empty())
    sched::save_kernel_times(kernel_times_, config_.schedule.kernel_cache);
}

const sched::KernelTimes* BenchmarkMode::measure(const graph::Graph& g) {
  if (!kernel_cache_read_ && !config_.schedule.kernel_cache.empty())
    kernel_times_ = sched::load_kernel_times(config_.schedule.kernel_cache);
  kernel_cache_read_ = true;
  // The ranks time their kernels side by side, as they run the step: each
  // kernel's time then holds what sharing the host's cores (and caches)
  // costs it. They start together; waiting, a rank sleeps rather than polls,
  // so that a polling peer takes no part of a core from a rank still timing.
  if (world_) wait_sleeping(world_->barrier());
  std::string failure;
  const KernelBenchmark timed = [&] {
    try {
      return measure_kernels(g, kernel_times_);
    } catch (const std::exception& e) {
      failure = e.what();
      return KernelBenchmark{};
    }
  }();
  if (world_) {
    // Every rank learns the lowest rank that failed, if any: it reports its
    // error and takes the job down; the others wait for that.
    Tensor reporter = Tensor::empty({1}, DType::f64);
    reporter.data<double>()[0] = failure.empty() ? world_->size() : world_->rank();
    wait_sleeping(world_->all_reduce(reporter, comm::ReduceOp::min));  // some may still be timing
    const auto first_failed = static_cast<int>(reporter.data<double>()[0]);
    if (first_failed < world_->size() && first_failed != world_->rank()) world_->barrier()->wait();
  }
  MT_CHECK(failure.empty(), "{}", failure);
  if (world_) align_kernel_times(kernel_times_, measurable_kernels(g), *world_);
  if (rank() == 0 && timed.measured > 0)
    fmt::print(stderr, "benchmark mode: timed {} kernels in {:.1f} s ({} known{}){}\n", timed.measured, timed.seconds,
               timed.known, config_.schedule.kernel_cache.empty() ? "" : " from " + config_.schedule.kernel_cache,
               world_ ? fmt::format(", the median of {} ranks", world_->size()) : "");
  const std::vector<std::vector<int64_t>> groups =
      world_ && world_->size() > 1 && config_.parallel.pp == 1
          ? mesh_groups(compile::check_parallel_config(config_, world_->size()))
          : std::vector<std::vector<int64_t>>{};
  // Measured once per run, unless the cache has every group size of the
  // mesh for a job of this size; the ranks agree on it (each read the cache).
  bool lateness_missing = std::any_of(groups.begin(), groups.end(), [&](const std::vector<int64_t>& group) {
    return !kernel_times_.sync_lateness.tables.count({world_->size(), static_cast<int64_t>(group.size())});
  });
  if (!groups.empty()) {
    Tensor missing = Tensor::empty({1}, DType::f64);
    missing.data<double>()[0] = lateness_missing ? 1 : 0;
    world_->all_reduce(missing, comm::ReduceOp::max)->wait();
    lateness_missing = missing.data<double>()[0] > 0;
  }
  if (lateness_missing) {
    wait_sleeping(world_->barrier());
    const sched::SyncLateness measured =
        measure_sync_lateness(g, groups, *world_, {.window = std::chrono::milliseconds(10)});
    kernel_times_.sync_lateness = measured.over(kernel_times_.sync_lateness);
    if (rank() == 0) {
      std::vector<std::string> per_size;
      for (const auto& [key, points] : measured.tables)
        if (!points.empty())
          per_size.push_back(fmt::format("in groups of {}, {:.1f}% over {:.0f} ms to {:.1f}% over {:.0f} ms", key.ranks,
                                         100 * points.front().share, points.front().interval_us / 1e3,
                                         100 * points.back().share, points.back().interval_us / 1e3));
      fmt::print(stderr, "benchmark mode: side by side, a group's slowest rank trails its mean {}\n",
                 fmt::join(per_size, "; "));
    }
  }
  return &kernel_times_;
}

}  // namespace meshtrain::estimate
