#include "cli/bench_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/mpi_backend.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "graph/attrs.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::cli {

namespace {

using comm::OpType;

// nccl-tests: busBw = algBw * factor, the bandwidth each link really carries.
double bus_factor(OpType op, int n) {
  if (op == OpType::all_reduce) return 2.0 * (n - 1) / n;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter, all_to_all
}

struct Buffers {
  Tensor in, out;
};

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

}  // namespace

int run_comm_bench(const CommBenchOptions& o) {
  MT_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes,
           "bench comm: need 4 <= --min-bytes <= --max-bytes, got {} and {}", o.min_bytes, o.max_bytes);
  MT_CHECK(o.rounds >= 1, "bench comm: --rounds must be at least 1, got {}", o.rounds);
  std::vector<OpType> ops;
  for (const auto& name : o.ops) {
    const OpType op = comm::parse_op_type(name);
    MT_CHECK(op == OpType::all_reduce || op == OpType::all_gather || op == OpType::reduce_scatter ||
                 op == OpType::all_to_all,
             "bench comm: --ops accepts all_reduce, all_gather, reduce_scatter, all_to_all; got '{}'", name);
    ops.push_back(op);
  }
  const int members = std::max(1, o.bucket);
  MT_CHECK(o.bucket >= 0, "bench comm: --bucket must be >= 0, got {}", o.bucket);
  MT_CHECK(o.bucket_cap >= 0, "bench comm: --bucket-cap must be >= 0, got {}", o.bucket_cap);
  if (members > 1)
    for (OpType op : ops)
      MT_CHECK(op != OpType::all_to_all,
               "bench comm: --bucket takes all_reduce, all_gather and reduce_scatter (the "
               "collectives training buckets), not all_to_all");
  comm::GroupOptions group_options;
  group_options.verify = o.verify;
  auto world = comm::create_world("mpi", group_options);
  MT_CHECK(world->size() >= 2,
           "bench comm needs at least 2 ranks; run it under mpirun, e.g. "
           "`mpirun -np 4 meshtrain bench comm`");
  const int groups_of = o.group_size > 0 ? o.group_size : world->size();
  MT_CHECK(groups_of >= 2 && world->size() % groups_of == 0,
           "bench comm: --group-size {} must be at least 2 and divide the {} ranks", o.group_size, world->size());
  const bool baseline = groups_of == world->size();  // plain MPI runs on the whole world only
  auto pg = baseline ? world : world->split(world->rank() / groups_of, 0, "bench_group");
  const int n = pg->size();
  const bool printer = world->rank() == 0;
  nlohmann::json results = nlohmann::json::array();
  if (printer && !o.json) {
    fmt::print(
        "meshtrain bench comm: {} ranks{}, f32, cross-rank verify {}; time = slowest rank's mean "
        "per iteration, median of {} alternating rounds; ratio = median over rounds of meshtrain busBw / MPI "
        "busBw; bandwidths in GB/s (1e9 B/s)\n",
        world->size(), baseline ? "" : fmt::format(" in groups of {} at once (no MPI baseline)", n),
        o.verify ? "on" : "off", o.rounds);
    if (members > 1)
      fmt::print(
          "bucketed: {} collectives of each size packed into {} (bucket_pack), one collective each "
          "(all_gather and reduce_scatter coalesced), unpacked (bucket_unpack), members the step's memory plan "
          "lays out in the bucket not copied (all but all_gather's inputs); time = all {} of them; MPI: {} plain calls one by one on the members' "
          "buffers (mpi_time_us, ratio) and one plain call per bucket on the packed bytes (one_call_us, "
          "ratio_1)\n",
          members, o.bucket_cap > 0 ? fmt::format("buckets of at most {}", human_bytes(o.bucket_cap)) : "one", members,
          members);
    fmt::print("{:<15} {:>8} {:>6} {:>11} {:>8} {:>8} {:>11} {:>8} {:>7}{}\n", "op", "size", "iters", "time_us",
               "algbw", "busbw", "mpi_time_us", "mpi_bus", "ratio",
               members > 1 ? fmt::format(" {:>11} {:>7}", "one_call_us", "ratio_1") : "");
    std::fflush(stdout);
  }
  for (OpType op : ops) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      int64_t elems = bytes / 4;
      elems -= elems % n;  // every rank gets a whole block
      if (elems == 0) continue;
      const int64_t used_bytes = elems * 4 * members;  // all the members' (one collective's without a bucket)
      const int iters = o.iters > 0 ? o.iters : static_cast<int>(std::clamp<int64_t>((64ll << 20) / used_bytes, 5, 50));
      Buffers b = make_buffers(op, elems, n);
      // The `members` collectives in buckets of at most `per_bucket` (the cap's worth, at least one).
      std::vector<Bucket> buckets;
      const int per_bucket =
          o.bucket_cap > 0 ? static_cast<int>(std::clamp<int64_t>(o.bucket_cap / (elems * 4), 1, members)) : members;
      if (members > 1)
        for (int first = 0; first < members; first += per_bucket)
          buckets.push_back(make_bucket(op, elems, n, std::min(per_bucket, members - first)));
      const bool bucketed = !buckets.empty();
      // meshtrain: the collective, or the buckets (a member alone as a plain
      // collective); plain MPI: as many calls one by one, and (bucketed) one
      // call per bucket on the packed bytes.
      auto ours_once = [&] {
        if (!bucketed) return run_meshtrain(*pg, op, b);
        for (Bucket& k : buckets) k.members.size() == 1 ? run_meshtrain(*pg, op, k.members[0]) : run_bucket(*pg, op, k);
      };
      auto theirs_once = [&] {  // on the members' own buffers, as a program without bucketing would
        if (!bucketed) return comm::plain_mpi_collective(op, b.in, b.out);
        for (Bucket& k : buckets)
          for (Buffers& m : k.members) comm::plain_mpi_collective(op, m.in, m.out);
      };
      auto fused_once = [&] {
        for (Bucket& k : buckets) comm::plain_mpi_collective(op, k.packed.in, k.packed.out);
      };
      ours_once();  // warm-up every path
      if (baseline) {
        std::lock_guard lock(comm::mpi_mutex());
        theirs_once();
        if (bucketed) fused_once();
      }
      std::vector<double> ours, theirs, fused;
      for (int round = 0; round < o.rounds; ++round) {
        ours.push_back(time_iterations(*pg, iters, false, ours_once));
        theirs.push_back(baseline ? time_iterations(*pg, iters, true, theirs_once)
                                  : std::numeric_limits<double>::quiet_NaN());
        if (bucketed && baseline) fused.push_back(time_iterations(*pg, iters, true, fused_once));
      }
      // Paired estimate: rounds next to each other in time share the
      // machine's conditions, so the ratio is taken per round, then the median.
      std::vector<double> ratios;
      for (size_t k = 0; k < ours.size(); ++k) ratios.push_back(theirs[k] / ours[k]);
      const double ratio = median(ratios);
      const double t = median(ours), tm = median(theirs);
      const double algbw = used_bytes / t / 1e9, busbw = algbw * bus_factor(op, n);
      const double mpi_busbw = used_bytes / tm / 1e9 * bus_factor(op, n);
      std::vector<double> fused_ratios;
      for (size_t k = 0; k < fused.size(); ++k) fused_ratios.push_back(fused[k] / ours[k]);
      if (!printer) continue;
      nlohmann::json row{{"op", comm::op_type_name(op)},
                         {"bytes", used_bytes / members},
                         {"iters", iters},
                         {"time_us", t * 1e6},
                         {"min_time_us", *std::min_element(ours.begin(), ours.end()) * 1e6},
                         {"algbw_gbs", algbw},
                         {"busbw_gbs", busbw},
                         {"mpi_time_us", tm * 1e6},
                         {"mpi_busbw_gbs", mpi_busbw},
                         {"ratio", ratio}};
      if (members > 1) {
        row["members"] = members;
        if (!fused.empty()) {
          row["mpi_one_call_time_us"] = median(fused) * 1e6;
          row["ratio_to_one_call"] = median(fused_ratios);
        }
      }
      results.push_back(row);
      if (!o.json) {
        fmt::print("{:<15} {:>8} {:>6} {:>11.1f} {:>8.3f} {:>8.3f} {:>11.1f} {:>8.3f} {:>7.3f}{}\n",
                   comm::op_type_name(op), human_bytes(used_bytes / members), iters, t * 1e6, algbw, busbw, tm * 1e6,
                   mpi_busbw, ratio,
                   fused.empty() ? "" : fmt::format(" {:>11.1f} {:>7.3f}", median(fused) * 1e6, median(fused_ratios)));
        std::fflush(stdout);
      }
    }
  }
  if (printer && o.json) {
    nlohmann::json j{{"ranks", world->size()},     {"group_size", n},    {"dtype", "f32"},
                     {"verify", o.verify},         {"rounds", o.rounds}, {"bucket", members},
                     {"bucket_cap", o.bucket_cap}, {"results", results}};
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
                            "Time all_reduce, all_gather, reduce_scatter and all_to_all (f32) from --min-bytes to "
                            "--max-bytes (x4 steps): time, algBw and busBw (nccl-tests convention) of meshtrain's "
                            "collectives next to the plain blocking MPI call, measured in the same run. Run under "
                            "mpirun, e.g. `mpirun -np 4 meshtrain bench comm`.");
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
  comm->add_flag("!--no-verify", opts->verify, "Skip meshtrain's cross-rank fingerprint check (on by default)");
  comm->add_option("--group-size", opts->group_size,
                   "Run the collectives in groups of this many ranks, every group at once, as a mesh dim of "
                   "that size inside a larger job does (0: all ranks; no MPI baseline otherwise)")
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
