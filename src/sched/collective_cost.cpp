#include "sched/collective_cost.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

namespace {
constexpr comm::OpType kCosted[] = {comm::OpType::all_gather, comm::OpType::reduce_scatter, comm::OpType::all_reduce,
                                    comm::OpType::all_to_all};
}  // namespace

comm::OpType costed_collective(std::string_view op) {
  for (comm::OpType type : kCosted)
    if (comm::op_type_name(type) == op) return type;
  MT_CHECK(false, "no collective cost rule for op '{}' (all_gather, reduce_scatter, all_reduce, all_to_all)", op);
  return comm::OpType::all_reduce;
}

CollectiveStream collective_stream(const graph::Node& started) {
  const auto& dims = started.attrs.get(graph::attr::mesh_dims);
  if (started.op->name == "ring_shift") return {dims, sharding::CommStream::main};
  return {dims, sharding::comm_stream(costed_collective(started.op->name))};
}

namespace {

// NCCL's tuning constants (src/graph/tuning.cc, ncclTunerConstantsDefaults),
// indexed [algorithm][protocol] with algorithms tree, ring and protocols LL,
// LL128, Simple; microseconds and GB/s.
enum Algo { kTree, kRing };
enum Proto { kLL, kLL128, kSimple };
constexpr double kBaseLatency[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
constexpr double kNvlinkLatency[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
constexpr double kNetLatency[2][3] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
// [row][hosts: 1, 2, more]; the row is the architecture within a host, the
// CPU (0 Intel, 1 AMD) across hosts.
constexpr double kLLMaxBw[4][3] = {{39, 39, 20.4}, {87.7, 22.5, 19.0}, {141, 45, 35}, {282, 90, 70}};
constexpr double kPerChannelRingLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {40, 40, 40}};
constexpr double kPerChannelTreeLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChannelTreeBw[4][3] = {{26.5, 18.5, 10}, {24, 23.6, 17.8}, {38.7, 41.4, 36}, {70, 42.8, 24}};
// Tree all_reduce bandwidth at medium sizes, by log2(bytes / 64).
constexpr double kTreeCorrection[3][24] = {
    {1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1},
    {1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

int log2i(double x) { return x < 1 ? 0 : static_cast<int>(std::floor(std::log2(x))); }

// The algorithm bandwidth (GB/s) of `algo` with `proto` for `bytes`, and
// its latency (us); with `corrected` false, without the tree's dip at
// medium sizes (the most that size ever gets). 0 bandwidth: not used.
struct AlgoCost {
  double gbps = 0, latency_us = 0;
};
AlgoCost algo_cost(comm::OpType kind, Algo algo, Proto proto, double bytes, int ranks, int hosts,
                   const NcclLinks& links, bool corrected = true) {
  const bool all_reduce = kind == comm::OpType::all_reduce;
  if (algo == kTree && !all_reduce) return {};
  if (proto == kLL128 && hosts > 1) return {};  // off across InfiniBand hosts
  const int arch = static_cast<int>(links.arch);
  const int by_hosts = hosts == 1 ? 0 : hosts == 2 ? 1 : 2;
  const int ll_row = hosts == 1 ? arch : (links.amd_host ? 1 : 0);
  const double channels = links.channels;
  double bw = hosts == 1 ? links.intra_bus_gbps : links.inter_gbps;
  if (hosts > 1) bw *= 0.77 + 0.23 * std::min(1.0, (hosts - 1) / 7.0);  // NIC efficiency
  if (hosts > 2) bw *= std::pow(std::max(bytes, 5e7) / 5e7, 0.17);      // several rails
  double bus = bw;
  if (algo == kRing && proto == kLL) bus = std::min(kLLMaxBw[ll_row][by_hosts], 0.5 * bus);
  if (algo == kRing && proto == kLL128) bus = std::min(0.92 * bus, channels * kPerChannelRingLL128Bw[arch][by_hosts]);
  if (algo == kTree && proto == kSimple) bus = std::min(0.92 * bus, channels * kPerChannelTreeBw[arch][by_hosts]);
  if (algo == kTree && proto == kLL) bus = std::min(bus / 3.8, kLLMaxBw[ll_row][by_hosts]);
  if (algo == kTree && proto == kLL128)
    bus = std::min(bus * (hosts == 1 ? 7.0 / 9.0 : 120.0 / 128.0), channels * kPerChannelTreeLL128Bw[arch][by_hosts]);
  // Ring all_gather and reduce_scatter take n - 1 steps, all_reduce 2(n - 1);
  // all_to_all sends (n - 1)/n of its buffer, as an all_gather does.
  const int steps = all_reduce ? 2 * (ranks - 1) : ranks - 1;
  double algorithm_bw = algo == kRing ? bus * ranks / steps : 0.5 * bus;
  if (algo == kTree && corrected) {
    const int size_class = log2i(bytes / 64);
    if (size_class < 23) algorithm_bw *= kTreeCorrection[proto][std::max(0, size_class)];
  }
  const double net_overhead = hosts > 1 ? (links.amd_host ? 2.0 : 1.0) * (proto == kSimple ? 3 : 1) : 0.0;
  const double intra = kNvlinkLatency[algo][proto], inter = kNetLatency[algo][proto];
  double latency = kBaseLatency[algo][proto];
  if (algo == kRing) {
    const int inter_steps = hosts == 1 ? 0 : all_reduce ? 2 * (hosts - 1) : hosts - 1;
    latency += (steps - inter_steps) * std::max(intra, net_overhead) + inter_steps * inter;
    if (all_reduce && proto == kSimple && hosts > 1 && bytes / (channels * ranks) >= 64)
      latency *= arch >= static_cast<int>(NcclLinks::Arch::ampere) ? 1.4 : 1.9;  // the ring's plateau
  } else {
    latency += 2 * ((ranks / hosts - 1) * intra + log2i(hosts) * inter);
  }
  return {algorithm_bw, latency};
}

double algo_time_us(comm::OpType kind, Algo algo, Proto proto, double bytes, int ranks, int hosts,
                    const NcclLinks& links) {
  const AlgoCost c = algo_cost(kind, algo, proto, bytes, ranks, hosts, links);
  return c.gbps > 0 ? c.latency_us + bytes / (1000 * c.gbps) : std::numeric_limits<double>::infinity();
}

void check_nccl_args(comm::OpType kind, int ranks, int hosts, const NcclLinks& links) {
  MT_CHECK(std::find(std::begin(kCosted), std::end(kCosted), kind) != std::end(kCosted),
           "nccl cost model: no cost rule for {}", comm::op_type_name(kind));
  MT_CHECK(ranks >= 1 && hosts >= 1 && hosts <= ranks, "nccl cost model: {} ranks on {} hosts", ranks, hosts);
  MT_CHECK(links.intra_bus_gbps > 0 && links.inter_gbps > 0 && links.channels > 0,
           "nccl cost model: bandwidths and channels must be positive");
}

}  // namespace

double nccl_collective_us(comm::OpType kind, double bytes, int ranks, int hosts, const NcclLinks& links) {
  check_nccl_args(kind, ranks, hosts, links);
  if (ranks == 1) return 0;
  double best = std::numeric_limits<double>::infinity();
  for (Algo algo : {kTree, kRing})
    for (Proto proto : {kLL, kLL128, kSimple})
      best = std::min(best, algo_time_us(kind, algo, proto, bytes, ranks, hosts, links));
  return best;
}

double nccl_collective_floor_us(comm::OpType kind, double bytes, int ranks, int hosts, const NcclLinks& links) {
  check_nccl_args(kind, ranks, hosts, links);
  if (ranks == 1 || bytes <= 0) return 0;
  double fastest = 0;
  for (Algo algo : {kTree, kRing})
    for (Proto proto : {kLL, kLL128, kSimple})
      fastest = std::max(fastest, algo_cost(kind, algo, proto, bytes, ranks, hosts, links, false).gbps);
  return bytes / (1000 * fastest);
}

double MeasuredCollectives::us(comm::OpType kind, double bytes, int ranks, int world, bool others_compute) const {
  if (ranks == 1) return 0;
  const std::vector<std::pair<double, double>>* points = nullptr;
  int distance = 0;
  std::vector<int> measured;
  const bool beside_compute =
      others_compute && std::any_of(tables.begin(), tables.end(), [&](const auto& entry) {
        return entry.first.kind == kind && entry.first.ranks == ranks && entry.first.others_compute;
      });
  for (const auto& [key, table] : tables) {
    if (key.kind != kind) continue;
    measured.push_back(key.ranks);
    if (key.ranks != ranks || key.others_compute != beside_compute || table.empty()) continue;
    const int d = std::abs(key.world - world);
    if (!points || d < distance) {
      points = &table;
      distance = d;
    }
  }
  if (!points) {
    std::sort(measured.begin(), measured.end());
    measured.erase(std::unique(measured.begin(), measured.end()), measured.end());
    MT_CHECK(false,
             "the profile's measured collectives have no {} over {} ranks (measured over: {}); bench comm --group-size "
             "measures other group sizes for the profile's tables",
             comm::op_type_name(kind), ranks,
             measured.empty() ? std::string("none") : fmt::format("{}", fmt::join(measured, ", ")));
  }
  const auto& p = *points;
  if (bytes <= p.front().first || p.size() == 1) return p.front().second;
  size_t hi = 1;
  while (hi + 1 < p.size() && p[hi].first < bytes) ++hi;
  const auto& [b0, t0] = p[hi - 1];
  const auto& [b1, t1] = p[hi];
  // Beyond the last point: the last two's slope, or flat where a noisy
  // measurement fell (a larger message never takes less time than the last).
  const double slope = (t1 - t0) / (b1 - b0);
  if (bytes > b1) return t1 + std::max(0.0, slope) * (bytes - b1);
  return t0 + slope * (bytes - b0);
}

}  // namespace meshtrain::sched
