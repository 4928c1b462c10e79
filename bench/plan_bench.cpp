// Redistribution planning time on a 3-D mesh: cold (a fresh Dijkstra search
// per pair) and cached (a repeated request). Targets: <= 50 us cold, <= 1 us
// cached (median over layout pairs).
//   build/plan_bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "sharding/planner.h"

using namespace meshtrain;
using namespace meshtrain::sharding;

namespace {

struct Pair {
  Layout src, dst;
};

// Every legal pair of layouts with R, S(0), S(1), P(sum) on each of 3 mesh
// dims (default and reversed shard orders).
std::vector<Pair> pairs_3d() {
  const std::vector<Placement> kinds{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                     Placement::partial()};
  std::vector<Layout> layouts;
  for (const auto& a : kinds)
    for (const auto& b : kinds)
      for (const auto& c : kinds) {
        Layout l = Layout::from_placements({a, b, c});
        layouts.push_back(l);
        for (int d = 0; d < 2; ++d) {
          const auto seq = l.shard_sequence(d);
          if (seq.size() < 2) continue;
          Layout r = l;
          for (size_t k = 0; k < seq.size(); ++k) r.order[seq[k]] = static_cast<int>(seq.size() - 1 - k);
          layouts.push_back(r);
        }
      }
  std::vector<Pair> pairs;
  for (const auto& s : layouts)
    for (const auto& d : layouts) {
      bool legal = !(s == d);
      for (int m = 0; m < 3; ++m) legal &= !d.placements[m].is_partial() || s.placements[m] == d.placements[m];
      if (legal) pairs.push_back({s, d});
    }
  return pairs;
}

const Shape kShape{4096, 4096};
const DeviceMesh kMesh({2, 2, 2});

void BM_PlanCold(benchmark::State& state) {
  const auto pairs = pairs_3d();
  Planner planner(kMesh, CostModel::for_mesh(kMesh));
  size_t i = 0;
  for (auto _ : state) {
    const Pair& p = pairs[i++ % pairs.size()];
    benchmark::DoNotOptimize(planner.plan_uncached(kShape, 4, p.src, p.dst));
  }
  state.SetLabel(std::to_string(pairs.size()) + " pairs, round robin");
}
BENCHMARK(BM_PlanCold);

void BM_PlanCached(benchmark::State& state) {
  const auto pairs = pairs_3d();
  Planner planner(kMesh, CostModel::for_mesh(kMesh));
  for (const auto& p : pairs) planner.plan(kShape, 4, p.src, p.dst);
  size_t i = 0;
  for (auto _ : state) {
    const Pair& p = pairs[i++ % pairs.size()];
    benchmark::DoNotOptimize(planner.plan(kShape, 4, p.src, p.dst));
  }
  state.SetLabel(std::to_string(pairs.size()) + " pairs, round robin");
}
BENCHMARK(BM_PlanCached);

// Per-pair times: each pair timed alone (best of `repeat`), then the
// distribution over pairs.
void print_distribution() {
  using Clock = std::chrono::steady_clock;
  const auto pairs = pairs_3d();
  Planner planner(kMesh, CostModel::for_mesh(kMesh));
  std::vector<double> cold, cached;
  constexpr int repeat = 5;
  for (const auto& p : pairs) {
    double best_cold = 1e30, best_cached = 1e30;
    for (int r = 0; r < repeat; ++r) {
      auto t0 = Clock::now();
      benchmark::DoNotOptimize(planner.plan_uncached(kShape, 4, p.src, p.dst));
      best_cold = std::min(best_cold, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    planner.plan(kShape, 4, p.src, p.dst);
    for (int r = 0; r < repeat; ++r) {
      auto t0 = Clock::now();
      benchmark::DoNotOptimize(planner.plan(kShape, 4, p.src, p.dst));
      best_cached = std::min(best_cached, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    cold.push_back(best_cold);
    cached.push_back(best_cached);
  }
  auto q = [](std::vector<double> v, double f) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(f * static_cast<double>(v.size() - 1))];
  };
  std::printf("\nper-pair planning time over %zu pairs on mesh (2,2,2), tensor (4096, 4096) f32 (best of %d each):\n",
              pairs.size(), repeat);
  std::printf("  cold   (Dijkstra): median %.2f us   p90 %.2f us   max %.2f us   target <= 50 us\n", q(cold, 0.5),
              q(cold, 0.9), q(cold, 1.0));
  std::printf("  cached (lookup)  : median %.3f us  p90 %.3f us  max %.3f us  target <= 1 us\n", q(cached, 0.5),
              q(cached, 0.9), q(cached, 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_distribution();
  return 0;
}
