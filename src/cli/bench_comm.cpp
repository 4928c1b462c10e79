#include "cli/bench_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "comm/mpi_backend.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "graph/attrs.h"
#include "kernels/cpu/op_kernels.h"
#include "train/rank_agreement.h"

namespace meshtrain::cli {

namespace {

using comm::OpType;

// nccl-tests: busBw = algBw * factor, the bandwidth each link really carries.
double bus_factor(OpType op, int n) {
  if (op == OpType::all_reduce) return 2.0 * (n - 1) / n;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter, all_to_all
}

// A collective the bench times: all_to_all_uneven is all_to_all with
// MoE-like uneven blocks (moe_counts), next to MPI_Alltoallv.
struct BenchOp {
  OpType op = OpType::all_to_all;
  bool uneven = false;
  std::string name() const { return uneven ? "all_to_all_uneven" : std::string(comm::op_type_name(op)); }
};

BenchOp parse_bench_op(const std::string& name) {
  if (name == "all_to_all_uneven") return {OpType::all_to_all, true};
  const OpType op = comm::parse_op_type(name);
  MT_CHECK(
      op == OpType::all_reduce || op == OpType::all_gather || op == OpType::reduce_scatter || op == OpType::all_to_all,
      "bench comm: --ops accepts all_reduce, all_gather, reduce_scatter, all_to_all, all_to_all_uneven; got '{}'",
      name);
  return {op, false};
}

struct Buffers {
  Tensor in, out;
  std::vector<int64_t> send_counts, recv_counts;  // an uneven all_to_all's, in elements per rank
};

// The blocks of an uneven all_to_all as an MoE layer's dispatch makes them:
// each rank sends its `elems` elements (tokens) to the ranks (experts) in
// skewed shares, rank j's popularity 1 / (k + 1) for its place k in a seeded
// shuffle (Zipf), times a factor in [0.5, 2) per pair. counts[i][j]: what
// rank i sends rank j. Every rank draws the same matrix.
std::vector<std::vector<int64_t>> moe_counts(int64_t elems, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> place(static_cast<size_t>(n));
  std::iota(place.begin(), place.end(), 0);
  std::shuffle(place.begin(), place.end(), rng);
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(n)));
  for (auto& row : counts) {
    std::vector<double> weight(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) weight[j] = (0.5 + 1.5 * (rng() / 4294967296.0)) / (place[j] + 1);
    const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
    for (int j = 0; j < n; ++j) row[j] = static_cast<int64_t>(static_cast<double>(elems) * weight[j] / total);
    row[std::max_element(weight.begin(), weight.end()) - weight.begin()] +=
        elems - std::accumulate(row.begin(), row.end(), int64_t{0});
  }
  return counts;
}

Buffers make_uneven_buffers(int64_t elems, int n, int rank) {
  const auto counts = moe_counts(elems, n, 20261127);
  Buffers b;
  b.send_counts = counts[rank];
  for (int i = 0; i < n; ++i) b.recv_counts.push_back(counts[i][rank]);
  b.in = Tensor::zeros({elems}, DType::f32);
  b.out = Tensor::zeros({std::accumulate(b.recv_counts.begin(), b.recv_counts.end(), int64_t{0})}, DType::f32);
  return b;
}

// nccl-tests sizes: all_reduce and all_to_all the buffer; all_gather the
// output; reduce_scatter the input.
Buffers make_buffers(OpType op, int64_t elems, int n) {
  Buffers b;
  switch (op) {
    case OpType::all_reduce:
      b.in = Tensor::zeros({elems}, DType::f32);
      b.out = b.in;
      break;
    case OpType::all_gather:
      b.in = Tensor::zeros({elems / n}, DType::f32);
      b.out = Tensor::zeros({elems}, DType::f32);
      break;
    case OpType::reduce_scatter:
      b.in = Tensor::zeros({elems}, DType::f32);
      b.out = Tensor::zeros({elems / n}, DType::f32);
      break;
    default:
      b.in = Tensor::zeros({elems}, DType::f32);
      b.out = Tensor::zeros({elems}, DType::f32);
  }
  return b;
}

void run_meshtrain(comm::ProcessGroup& pg, OpType op, Buffers& b) {
  if (!b.send_counts.empty()) {
    pg.all_to_all(b.in, b.out, b.send_counts, b.recv_counts)->wait();
    return;
  }
  switch (op) {
    case OpType::all_reduce:
      pg.all_reduce(b.in)->wait();
      return;
    case OpType::all_gather:
      pg.all_gather(b.in, b.out)->wait();
      return;
    case OpType::reduce_scatter:
      pg.reduce_scatter(b.in, b.out)->wait();
      return;
    default:
      pg.all_to_all(b.in, b.out)->wait();
      return;
  }
}

// `members` collectives of one size as the trainer's bucketing runs them:
// bucket_pack lays the members out one after another, one collective moves
// them (all_gather and reduce_scatter coalesced, each member whole on the
// side of every rank's block), bucket_unpack takes them back (the same CPU
// kernels the bucketed step runs). Where the step's memory plan makes the
// members views of the bucket, so are they here, and those kernels copy
// nothing for them: all members on both sides, except an all_gather's
// inputs, which are copied in (parameters, as in f32 FSDP).
struct Bucket {
  std::vector<Buffers> members;
  Buffers packed;
  std::vector<int64_t> member_blocks;  // each member's block per rank, for the coalesced collectives
};

Bucket make_bucket(OpType op, int64_t elems, int n, int members) {
  Bucket b;
  for (int m = 0; m < members; ++m) b.members.push_back(make_buffers(op, elems, n));
  b.packed = make_buffers(op, elems * members, n);
  auto view_of_packed = [](Tensor& packed, int64_t elems_each, int m) {
    return Tensor::view(packed.data<float>().data() + m * elems_each, {elems_each}, DType::f32);
  };
  for (int m = 0; m < members; ++m) {
    Buffers& member = b.members[m];
    switch (op) {
      case OpType::all_reduce:
        member.in = member.out = view_of_packed(b.packed.in, elems, m);
        break;
      case OpType::all_gather:
        member.out = view_of_packed(b.packed.out, elems, m);
        break;
      case OpType::reduce_scatter:
        member.in = view_of_packed(b.packed.in, elems, m);
        member.out = view_of_packed(b.packed.out, elems / n, m);
        break;
      default:
        break;  // all_to_all is never bucketed: run_comm_bench refuses it
    }
  }
  b.member_blocks.assign(static_cast<size_t>(members), elems / n);
  return b;
}

void run_bucket(comm::ProcessGroup& pg, OpType op, Bucket& b) {
  static const kernels::cpu::CpuKernel& pack = *kernels::cpu::find_cpu_kernel("bucket_pack");
  static const kernels::cpu::CpuKernel& unpack = *kernels::cpu::find_cpu_kernel("bucket_unpack");
  const graph::Attrs none;
  kernels::cpu::KernelArgs packing{{}, {&b.packed.in}, none};
  for (const Buffers& m : b.members) packing.in.push_back(&m.in);
  pack(packing);
  switch (op) {
    case OpType::all_gather:
      pg.all_gather_coalesced(b.packed.in, b.packed.out, b.member_blocks)->wait();
      break;
    case OpType::reduce_scatter:
      pg.reduce_scatter_coalesced(b.packed.in, b.packed.out, b.member_blocks)->wait();
      break;
    default:
      run_meshtrain(pg, op, b.packed);
  }
  kernels::cpu::KernelArgs unpacking{{&b.packed.out}, {}, none};
  for (Buffers& m : b.members) unpacking.out.push_back(&m.out);
  unpack(unpacking);
}

// Keeps this rank's core busy for `d` of wall-clock time (dependent
// multiply-adds, checking the clock every few microseconds).
void busy_for(std::chrono::microseconds d) {
  static volatile double sink = 0;
  const auto until = std::chrono::steady_clock::now() + d;
  double x = sink + 1.0;
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 2000; ++i) x = x * 0.999999 + 1e-7;
  sink = x;
}

// Mean seconds per iteration, the maximum over ranks (the slowest rank sets
// the pace). `exclusive_mpi`: hold the MPI lock for the whole loop, so the
// plain MPI calls run as in a program without meshtrain (its progress thread
// waits instead of contending for the lock between iterations).
template <typename Fn>
double time_iterations(comm::ProcessGroup& pg, int iters, bool exclusive_mpi, Fn&& fn) {
  pg.barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock lock(comm::mpi_mutex(), std::defer_lock);
    if (exclusive_mpi) lock.lock();
    for (int i = 0; i < iters; ++i) fn();
  }
  double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  Tensor t = Tensor::empty({1}, DType::f32);
  t.data<float>()[0] = static_cast<float>(local);
  pg.all_reduce(t, comm::ReduceOp::max)->wait();
  return t.data<float>()[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string human_bytes(int64_t b) {
  if (b >= (1 << 20)) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10)) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::vector<BenchOp> parse_ops(const CommBenchOptions& o) {
  std::vector<BenchOp> ops;
  for (const auto& name : o.ops) ops.push_back(parse_bench_op(name));
  MT_CHECK(o.bucket >= 0, "bench comm: --bucket must be >= 0, got {}", o.bucket);
  MT_CHECK(o.bucket_cap >= 0, "bench comm: --bucket-cap must be >= 0, got {}", o.bucket_cap);
  if (o.bucket > 1)
    for (const BenchOp& op : ops)
      MT_CHECK(op.op != OpType::all_to_all,
               "bench comm: --bucket takes all_reduce, all_gather and reduce_scatter (the "
               "collectives training buckets), not {}",
               op.name());
  return ops;
}

// One op at one size: its buffers, or `members` collectives in buckets.
struct SizeRun {
  BenchOp op;
  int64_t elems = 0;  // per collective: nccl-tests' size (make_buffers), the send buffer of an uneven all_to_all
  int members = 1;
  int iters = 0;
  Buffers b;
  std::vector<Bucket> buckets;                           // empty: one collective at a time
  int64_t bytes() const { return elems * 4 * members; }  // all the members'
};

SizeRun make_size_run(const CommBenchOptions& o, const BenchOp& op, int64_t elems, const comm::ProcessGroup& pg) {
  SizeRun run{op, elems, std::max(1, o.bucket)};
  run.iters = o.iters > 0 ? o.iters : static_cast<int>(std::clamp<int64_t>((64ll << 20) / run.bytes(), 5, 50));
  run.b = op.uneven ? make_uneven_buffers(elems, pg.size(), pg.rank()) : make_buffers(op.op, elems, pg.size());
  // The members in buckets of at most `per_bucket` (the cap's worth, at least one).
  const int per_bucket = o.bucket_cap > 0
                             ? static_cast<int>(std::clamp<int64_t>(o.bucket_cap / (elems * 4), 1, run.members))
                             : run.members;
  if (run.members > 1)
    for (int first = 0; first < run.members; first += per_bucket)
      run.buckets.push_back(make_bucket(op.op, elems, pg.size(), std::min(per_bucket, run.members - first)));
  return run;
}

// meshtrain: the collective, or the buckets (a member alone as a plain
// collective).
void run_ours(comm::ProcessGroup& pg, SizeRun& run) {
  if (run.buckets.empty()) return run_meshtrain(pg, run.op.op, run.b);
  for (Bucket& k : run.buckets)
    k.members.size() == 1 ? run_meshtrain(pg, run.op.op, k.members[0]) : run_bucket(pg, run.op.op, k);
}

// Plain MPI: as many calls one by one, on the members' own buffers, as a
// program without bucketing would make.
void run_theirs(SizeRun& run) {
  if (run.op.uneven) return comm::plain_mpi_all_to_allv(run.b.in, run.b.out, run.b.send_counts, run.b.recv_counts);
  if (run.buckets.empty()) return comm::plain_mpi_collective(run.op.op, run.b.in, run.b.out);
  for (Bucket& k : run.buckets)
    for (Buffers& m : k.members) comm::plain_mpi_collective(run.op.op, m.in, m.out);
}

// Plain MPI, bucketed: one call per bucket on the packed bytes.
void run_fused(SizeRun& run) {
  for (Bucket& k : run.buckets) comm::plain_mpi_collective(run.op.op, k.packed.in, k.packed.out);
}

// Seconds per iteration in each round: meshtrain's, plain MPI's and (bucketed)
// one MPI call per bucket's.
struct Rounds {
  std::vector<double> ours, theirs, fused;
};

// Seconds per iteration of `fn` after `compute` of busy time each
// iteration, the busy time not counted.
template <typename Fn>
double time_after_compute(comm::ProcessGroup& pg, int iters, bool exclusive_mpi, std::chrono::microseconds compute,
                          Fn&& fn) {
  if (compute.count() == 0) return time_iterations(pg, iters, exclusive_mpi, fn);
  return time_iterations(pg, iters, exclusive_mpi,
                         [&] {
                           busy_for(compute);
                           fn();
                         }) -
         std::chrono::duration<double>(compute).count();
}

Rounds measure(comm::ProcessGroup& pg, SizeRun& run, int rounds, bool baseline, std::chrono::microseconds compute) {
  const bool fused = baseline && !run.buckets.empty();
  run_ours(pg, run);  // warm-up every path
  if (baseline) {
    std::lock_guard lock(comm::mpi_mutex());
    run_theirs(run);
    if (fused) run_fused(run);
  }
  Rounds r;
  for (int round = 0; round < rounds; ++round) {
    r.ours.push_back(time_after_compute(pg, run.iters, false, compute, [&] { run_ours(pg, run); }));
    r.theirs.push_back(baseline ? time_after_compute(pg, run.iters, true, compute, [&] { run_theirs(run); })
                                : std::numeric_limits<double>::quiet_NaN());
    if (fused) r.fused.push_back(time_after_compute(pg, run.iters, true, compute, [&] { run_fused(run); }));
  }
  return r;
}

// Paired estimate: rounds next to each other in time share the machine's
// conditions, so the ratio of a baseline's time to meshtrain's is taken per
// round, then the median.
double paired_ratio(const std::vector<double>& baseline, const std::vector<double>& ours) {
  std::vector<double> ratios;
  for (size_t k = 0; k < baseline.size(); ++k) ratios.push_back(baseline[k] / ours[k]);
  return median(ratios);
}

nlohmann::json result_row(const SizeRun& run, const Rounds& r, int n) {
  const double t = median(r.ours), tm = median(r.theirs), factor = bus_factor(run.op.op, n);
  nlohmann::json row{{"op", run.op.name()},
                     {"bytes", run.bytes() / run.members},
                     {"iters", run.iters},
                     {"time_us", t * 1e6},
                     {"min_time_us", *std::min_element(r.ours.begin(), r.ours.end()) * 1e6},
                     {"algbw_gbs", run.bytes() / t / 1e9},
                     {"busbw_gbs", run.bytes() / t / 1e9 * factor},
                     {"mpi_time_us", tm * 1e6},
                     {"mpi_busbw_gbs", run.bytes() / tm / 1e9 * factor},
                     {"ratio", paired_ratio(r.theirs, r.ours)}};
  if (run.members > 1) {
    row["members"] = run.members;
    if (!r.fused.empty()) {
      row["mpi_one_call_time_us"] = median(r.fused) * 1e6;
      row["ratio_to_one_call"] = paired_ratio(r.fused, r.ours);
    }
  }
  return row;
}

void print_header(const CommBenchOptions& o, int ranks, const comm::ProcessGroup& pg, bool baseline) {
  const int n = pg.size();
  fmt::print(
      "meshtrain bench comm: {} ranks{}, f32, cross-rank verify {}{}; time = slowest rank's mean "
      "per iteration, median of {} alternating rounds; ratio = median over rounds of meshtrain busBw / MPI "
      "busBw; bandwidths in GB/s (1e9 B/s)\n",
      ranks,
      baseline           ? ""
      : o.others_compute ? fmt::format(" in a group of {} while the other ranks compute (no MPI baseline)", n)
                         : fmt::format(" in groups of {} at once (no MPI baseline)", n),
      o.verify || pg.shares_memory() ? "on" : "off",
      pg.shares_memory() ? ", first messages and small pieces through shared memory (MESHTRAIN_SHM=0: MPI)" : "",
      o.rounds);
  const int members = std::max(1, o.bucket);
  if (members > 1)
    fmt::print(
        "bucketed: {} collectives of each size packed into {} (bucket_pack), one collective each "
        "(all_gather and reduce_scatter coalesced), unpacked (bucket_unpack), members the step's memory plan "
        "lays out in the bucket not copied (all but all_gather's inputs); time = all {} of them; MPI: {} plain calls "
        "one by one on the members' buffers (mpi_time_us, ratio) and one plain call per bucket on the packed bytes "
        "(one_call_us, ratio_1)\n",
        members, o.bucket_cap > 0 ? fmt::format("buckets of at most {}", human_bytes(o.bucket_cap)) : "one", members,
        members);
  if (std::find(o.ops.begin(), o.ops.end(), "all_to_all_uneven") != o.ops.end())
    fmt::print(
        "all_to_all_uneven: all_to_all with MoE-like blocks (each rank's send buffer of `size` split over the ranks "
        "by a seeded Zipf popularity times a factor in [0.5, 2) per pair), next to MPI_Alltoallv\n");
  fmt::print("{:<18} {:>8} {:>6} {:>11} {:>8} {:>8} {:>11} {:>8} {:>7}{}\n", "op", "size", "iters", "time_us", "algbw",
             "busbw", "mpi_time_us", "mpi_bus", "ratio",
             members > 1 ? fmt::format(" {:>11} {:>7}", "one_call_us", "ratio_1") : "");
}

void print_row(const nlohmann::json& row) {
  const bool fused = row.contains("ratio_to_one_call");
  fmt::print("{:<18} {:>8} {:>6} {:>11.1f} {:>8.3f} {:>8.3f} {:>11.1f} {:>8.3f} {:>7.3f}{}\n",
             row["op"].get<std::string>(), human_bytes(row["bytes"].get<int64_t>()), row["iters"].get<int>(),
             row["time_us"].get<double>(), row["algbw_gbs"].get<double>(), row["busbw_gbs"].get<double>(),
             row["mpi_time_us"].get<double>(), row["mpi_busbw_gbs"].get<double>(), row["ratio"].get<double>(),
             fused ? fmt::format(" {:>11.1f} {:>7.3f}", row["mpi_one_call_time_us"].get<double>(),
                                 row["ratio_to_one_call"].get<double>())
                   : "");
  std::fflush(stdout);
}

// --others-compute: the ranks outside the timed group keep their cores busy
// (a pipeline's other stages computing while a stage's collectives run)
// until the group's first rank says it is done.
constexpr int kDoneTag = 7301;

void compute_until_done(comm::ProcessGroup& world) {
  Tensor done_flag = Tensor::empty({1}, DType::f32);
  const comm::WorkPtr done = world.recv(done_flag, 0, kDoneTag);
  while (!done->is_completed()) busy_for(std::chrono::microseconds(100));
  done->wait();
}

void tell_the_others_done(comm::ProcessGroup& world, int timed_ranks) {
  Tensor done_flag = Tensor::zeros({1}, DType::f32);
  for (int r = timed_ranks; r < world.size(); ++r) world.send(done_flag, r, kDoneTag)->wait();
}

// The options, checked against the job (a collective under mpirun: an
// error every rank meets is said once, by rank 0).
std::vector<BenchOp> checked_ops(const CommBenchOptions& o, comm::ProcessGroup& world, int groups_of) {
  std::vector<BenchOp> ops;
  train::fail_together(&world, [&] {
    MT_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes,
             "bench comm: need 4 <= --min-bytes <= --max-bytes, got {} and {}", o.min_bytes, o.max_bytes);
    MT_CHECK(o.rounds >= 1, "bench comm: --rounds must be at least 1, got {}", o.rounds);
    MT_CHECK(o.compute_us >= 0 && o.compute_us <= 1'000'000,
             "bench comm: --compute-us must be from 0 to 1000000, got {}", o.compute_us);
    ops = parse_ops(o);
    MT_CHECK(world.size() >= 2,
             "bench comm needs at least 2 ranks; run it under mpirun, e.g. "
             "`mpirun -np 4 meshtrain bench comm`");
    MT_CHECK(groups_of >= 2 && world.size() % groups_of == 0,
             "bench comm: --group-size {} must be at least 2 and divide the {} ranks", o.group_size, world.size());
    MT_CHECK(!o.others_compute || groups_of < world.size(),
             "bench comm: --others-compute needs --group-size smaller than the {} ranks (the ranks outside the "
             "first group compute)",
             world.size());
  });
  return ops;
}

}  // namespace

int run_comm_bench(const CommBenchOptions& o) {
  comm::GroupOptions group_options;
  group_options.verify = o.verify;
  auto world = comm::create_world("mpi", group_options);
  const int groups_of = o.group_size > 0 ? o.group_size : world->size();
  const std::vector<BenchOp> ops = checked_ops(o, *world, groups_of);
  const bool baseline = groups_of == world->size();  // plain MPI runs on the whole world only
  auto pg = baseline ? world : world->split(world->rank() / groups_of, 0, "bench_group");
  if (o.others_compute && world->rank() >= groups_of) {
    compute_until_done(*world);
    return 0;
  }
  const bool printer = world->rank() == 0;
  if (printer && !o.json) print_header(o, world->size(), *pg, baseline);
  nlohmann::json results = nlohmann::json::array();
  for (const BenchOp& op : ops) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      const int64_t elems = bytes / 4 - bytes / 4 % pg->size();  // every rank gets a whole block
      if (elems == 0) continue;
      SizeRun run = make_size_run(o, op, elems, *pg);
      const Rounds rounds = measure(*pg, run, o.rounds, baseline, std::chrono::microseconds(o.compute_us));
      if (!printer) continue;
      results.push_back(result_row(run, rounds, pg->size()));
      if (!o.json) print_row(results.back());
    }
  }
  if (o.others_compute && world->rank() == 0) tell_the_others_done(*world, groups_of);
  if (printer && o.json) {
    nlohmann::json j{{"ranks", world->size()},
                     {"group_size", pg->size()},
                     {"dtype", "f32"},
                     {"verify", o.verify},
                     {"rounds", o.rounds},
                     {"bucket", std::max(1, o.bucket)},
                     {"bucket_cap", o.bucket_cap},
                     {"others_compute", o.others_compute},
                     {"compute_us", o.compute_us},
                     {"results", results}};
    fmt::print("{}\n", j.dump(1));
  }
  return 0;
}

Command add_bench_comm_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto opts = std::make_shared<CommBenchOptions>();
  CLI::App* comm =
      bench->add_subcommand("comm",
                            "Time all_reduce, all_gather, reduce_scatter, all_to_all and all_to_all_uneven (MoE-like "
                            "blocks) (f32) from --min-bytes to --max-bytes (x4 steps): time, algBw and busBw "
                            "(nccl-tests convention) of meshtrain's collectives next to the plain blocking MPI call "
                            "(MPI_Alltoallv for all_to_all_uneven), measured in the same run. Run under mpirun, e.g. "
                            "`mpirun -np 4 meshtrain bench comm`.");
  comm->add_option("--ops", opts->ops, "Collectives to time")->delimiter(',')->capture_default_str();
  comm->add_option("--min-bytes", opts->min_bytes, "Smallest size (4K, 1M... allowed)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  comm->add_option("--max-bytes", opts->max_bytes, "Largest size")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  comm->add_option("--rounds", opts->rounds, "Alternating meshtrain/MPI rounds per size (median reported)")
      ->capture_default_str();
  comm->add_option("--iters", opts->iters, "Iterations per round (0: by size, 5..50)")->capture_default_str();
  comm->add_flag(
      "!--no-verify", opts->verify,
      "Skip meshtrain's cross-rank fingerprint check (on by default; kept in groups that share memory, where it is free)");
  comm->add_option("--group-size", opts->group_size,
                   "Run the collectives in groups of this many ranks, every group at once, as a mesh dim of "
                   "that size inside a larger job does (0: all ranks; no MPI baseline otherwise)")
      ->capture_default_str();
  comm->add_flag("--others-compute", opts->others_compute,
                 "With --group-size: only the first group runs the collectives while the other ranks keep their "
                 "cores busy, as a pipeline's other stages compute beside a stage's collectives (on a host whose "
                 "cores the ranks share, a collective then waits for its ranks' turns on the cores)");
  comm->add_option("--compute-us", opts->compute_us,
                   "Keep the core busy this many microseconds before each collective, as a step computes between "
                   "its collectives; the time reported leaves them out (0: collectives back to back)")
      ->capture_default_str();
  comm->add_option("--bucket", opts->bucket,
                   "Time this many collectives of each size at once, bucketed as training buckets them "
                   "(packed, one collective, unpacked; all_reduce, all_gather, reduce_scatter), next to the "
                   "same collectives as plain MPI calls one by one and as one MPI call on the packed bytes "
                   "(0: one at a time)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  comm->add_option("--bucket-cap", opts->bucket_cap,
                   "With --bucket: consecutive collectives share a bucket while its bytes (as the size column counts "
                   "them) stay within this size, one alone runs as a plain "
                   "collective, as schedule.bucket_mode = \"size_cap\" does (0: all in one bucket)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  comm->add_flag("--json", opts->json, "Print one JSON document instead of a table");

  return {comm, [opts] { return run_comm_bench(*opts); }};
}

}  // namespace meshtrain::cli
