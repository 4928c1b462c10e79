// Estimating a step without running it: NCCL's collective cost model against
// hand-worked examples, measured tables, hardware profiles as TOML, and the
// memory estimate of a schedule against the memory plan and by-hand byte
// counts.
#include "estimate/estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "comm/local_backend.h"
#include "compile/compile.h"
#include "config/config.h"
#include "estimate/kernel_benchmark.h"
#include "graph/builder.h"
#include "sched/collective_cost.h"
#include "sched/hardware.h"
#include "sched/memory_estimate.h"
#include "sched/schedule.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using mtest::contains;
using mtest::message_of;

namespace {
sched::NcclLinks hopper_320() {
  sched::NcclLinks links;
  links.arch = sched::NcclLinks::Arch::hopper;
  links.intra_bus_gbps = 320;  // 16 channels x 20 GB/s
  links.channels = 16;
  return links;
}
}  // namespace

// 256 MiB all_reduce over 8 ranks of one host: ring with the Simple protocol
// wins, 8.4 us + 2(n-1) hops x 3.4 us + 2(n-1)/n x bytes at 320 GB/s.
TEST(CollectiveCost, NcclPicksRingSimpleForALargeAllReduce) {
  const double bytes = 256.0 * (1 << 20);
  const double ring_simple = 8.4 + 14 * 3.4 + bytes * 14 / 8 / (1000 * 320);
  EXPECT_NEAR(sched::nccl_collective_us(comm::OpType::all_reduce, bytes, 8, 1, hopper_320()), ring_simple, 1e-6);
}

// At 64 KiB the low-latency protocol wins: LL's bus bandwidth is capped at
// 141 GB/s on Hopper, its hops cost 0.6 us.
TEST(CollectiveCost, NcclPicksRingLLForASmallAllReduce) {
  const double bytes = 65536;
  const double ring_ll = 6.6 + 14 * 0.6 + bytes * 14 / 8 / (1000 * 141);
  EXPECT_NEAR(sched::nccl_collective_us(comm::OpType::all_reduce, bytes, 8, 1, hopper_320()), ring_ll, 1e-6);
  // An all_gather of the same buffer takes n - 1 steps, not 2(n - 1).
  EXPECT_NEAR(sched::nccl_collective_us(comm::OpType::all_gather, bytes, 8, 1, hopper_320()),
              6.6 + 7 * 0.6 + bytes * 7 / 8 / (1000 * 141), 1e-6);
  EXPECT_EQ(sched::nccl_collective_us(comm::OpType::all_reduce, bytes, 1, 1, hopper_320()), 0);
}

// Across hosts the network's bandwidth and latency take over.
TEST(CollectiveCost, AcrossHostsCostsMoreThanWithinOne) {
  const double bytes = 1 << 30;
  const auto links = hopper_320();
  const double one_host = sched::nccl_collective_us(comm::OpType::reduce_scatter, bytes, 8, 1, links);
  const double two_hosts = sched::nccl_collective_us(comm::OpType::reduce_scatter, bytes, 16, 2, links);
  // Ring/Simple over 2 hosts: the NIC at 50 GB/s x 0.77 + 0.23/7 efficiency.
  const double bw = 50 * (0.77 + 0.23 / 7);
  const double latency = 8.4 + 14 * 3.4 /* max(3.4, 3 x 1 us overhead) */ + 1 * 14.0;
  EXPECT_NEAR(two_hosts, latency + bytes * 15 / 16 / (1000 * bw), 1e-6);
  EXPECT_GT(two_hosts, 5 * one_host);
}

TEST(CollectiveCost, MeasuredTableInterpolates) {
  sched::MeasuredCollectives m;
  m.tables[{comm::OpType::all_gather, 4}] = {{1000, 10}, {3000, 30}, {5000, 40}};
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 4), 10);    // below the first point: its time
  EXPECT_EQ(m.us(comm::OpType::all_gather, 2000, 4), 20);  // between points: the line
  EXPECT_EQ(m.us(comm::OpType::all_gather, 9000, 4), 60);  // beyond: the last two's slope
  EXPECT_EQ(m.us(comm::OpType::all_gather, 9000, 1), 0);
  // A noisy table whose last point fell: beyond it, flat, never below zero.
  m.tables[{comm::OpType::all_reduce, 2}] = {{0, 100}, {1, 0}};
  EXPECT_EQ(m.us(comm::OpType::all_reduce, 1e12, 2), 0);
  EXPECT_EQ(m.us(comm::OpType::all_reduce, 0.5, 2), 50);
  // Measured inside a job of 8 ranks (two groups of 4 at once): that table
  // for a job of 8 or more, the other for smaller ones.
  m.tables[{comm::OpType::all_gather, 4, 8}] = {{1000, 100}};
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 4, 8), 100);
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 4, 16), 100);
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 4, 4), 10);
  EXPECT_TRUE(contains(message_of([&] { m.us(comm::OpType::all_gather, 10, 2); }),
                       "no all_gather over 2 ranks (measured over: 4)"));
}

// A table measured while the job's other ranks computed (bench comm
// --others-compute) costs a collective beside computing ranks, and only
// that one: for an op or group size without such a table, the plain tables.
TEST(CollectiveCost, OthersComputeTablesCostOnlyCollectivesBesideCompute) {
  sched::MeasuredCollectives m;
  m.tables[{comm::OpType::all_gather, 2, 4}] = {{1000, 10}};
  m.tables[{comm::OpType::all_gather, 4, 4}] = {{1000, 20}};
  m.tables[{comm::OpType::reduce_scatter, 2, 4}] = {{1000, 30}};
  m.tables[{comm::OpType::all_gather, 2, 4, true}] = {{1000, 150}};
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 2, 4), 10);
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 2, 4, true), 150);
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 2, 8, true), 150);  // the nearest job size's
  EXPECT_EQ(m.us(comm::OpType::all_gather, 10, 4, 4, true), 20);
  EXPECT_EQ(m.us(comm::OpType::reduce_scatter, 10, 2, 4, true), 30);
}

TEST(Hardware, BuiltinsAndFiles) {
  const auto names = sched::builtin_hardware_names();
  ASSERT_GE(names.size(), 2u);
  const sched::HardwareProfile h100 = sched::builtin_hardware("h100-sxm");
  EXPECT_EQ(h100.peak_gflops_bf16, 989400);
  EXPECT_EQ(h100.peak_gflops_fp8, 1978900);
  EXPECT_EQ(h100.devices_per_host, 8);
  EXPECT_EQ(h100.op_efficiency.at("attention"), 0.35);
  // Ranks 0..7 share a host; 0 and 8 do not.
  EXPECT_LT(h100.collective_us(comm::OpType::all_gather, 1e8, {0, 1}, 16),
            h100.collective_us(comm::OpType::all_gather, 1e8, {0, 8}, 16));
  EXPECT_TRUE(contains(message_of([] { sched::builtin_hardware("tpu"); }), "no built-in hardware profile 'tpu'"));
  const std::string measured = R"(name = "mine"
[device]
peak_gflops_f32 = 100
memory_gbps = 20
shared_host = true
[collectives]
model = "measured"
[[collectives.table]]
op = "all_reduce"
ranks = 2
bytes = [0, 1000]
us = [5, 15]
)";
  const sched::HardwareProfile p = sched::parse_hardware(measured, "test");
  EXPECT_EQ(p.collective_us(comm::OpType::all_reduce, 500, {0, 1}, 2), 10);
  // How far a group's slowest rank trails: shared hosts only, checked.
  const std::string lateness =
      "[[device.sync_lateness]]\nworld = 4\nranks = 4\ninterval_us = [1000, 3000]\nshare = [0.5, 0.25]\n";
  const sched::HardwareProfile uneven = sched::parse_hardware(measured + lateness, "test");
  EXPECT_NEAR(uneven.sync_lateness.us(4, 4, 2000), 2000 * 0.375, 1e-9);
  EXPECT_TRUE(p.sync_lateness.empty());
  std::string not_shared = measured + lateness;
  not_shared.replace(not_shared.find("shared_host = true"), 18, "shared_host = false");
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(not_shared, "test"); }),
                       "device.sync_lateness is for ranks that share a host's cores"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + lateness + "colour = 1\n", "test"); }),
                       "device.sync_lateness.colour unknown"));
  std::string shorter = lateness;
  shorter.replace(shorter.find("[0.5, 0.25]"), 11, "[0.5]");
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + shorter, "test"); }),
                       "interval_us and share must be as long"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + lateness + lateness, "test"); }),
                       "for groups of 4 ranks in a job of 4: given twice"));
  // The error of the measured profile with `table` added after one edit of it.
  const auto profile_error = [&](std::string table, const std::string& from, const std::string& to) {
    table.replace(table.find(from), from.size(), to);
    return message_of([&] { sched::parse_hardware(measured + table, "test"); });
  };
  EXPECT_TRUE(contains(profile_error(lateness, "world = 4\n", ""), "device.sync_lateness.world is required"));
  EXPECT_TRUE(
      contains(profile_error(lateness, "ranks = 4", "ranks = \"4\""), "device.sync_lateness.ranks must be an integer"));
  EXPECT_TRUE(contains(profile_error(lateness, "interval_us = [1000, 3000]\n", ""),
                       "device.sync_lateness.interval_us must be an array of numbers"));
  EXPECT_TRUE(contains(profile_error(lateness, "share = [0.5, 0.25]", "share = [25, 10]"),
                       "a share must be a number from 0 to 3 (a fraction of the stretch, not a percentage), got 25"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + "world = 3\n", "test"); }),
                       "collectives.table.world 3 must be a multiple of ranks 2"));
  // A table measured while the other ranks computed: read, and used only for collectives beside them.
  const std::string beside =
      "[[collectives.table]]\nop = \"all_reduce\"\nranks = 2\nworld = 4\nothers_compute = true\n"
      "bytes = [0, 1000]\nus = [105, 115]\n";
  const sched::HardwareProfile others = sched::parse_hardware(measured + beside, "test");
  EXPECT_EQ(others.collective_us(comm::OpType::all_reduce, 500, {0, 1}, 4, true), 110);
  EXPECT_EQ(others.collective_us(comm::OpType::all_reduce, 500, {0, 1}, 4), 10);
  EXPECT_TRUE(contains(profile_error(beside, "true", "1"), "collectives.table.others_compute must be true or false"));
  EXPECT_TRUE(contains(profile_error(beside, "world = 4", "world = 2"),
                       "collectives.table.others_compute needs a world larger than the group's 2 ranks"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + beside + beside, "test"); }),
                       "all_reduce over 2 ranks in a job of 4 while the others compute: given twice"));
  EXPECT_EQ(p.rank_share(2), 0.5);  // the job's ranks share the host
  EXPECT_EQ(p.rank_share(16), 1.0 / 16);
  EXPECT_EQ(p.busy_share(4, 1), 0.25);  // the host's cores unknown: never more than the rank's share
  // 2 cores, 4 ranks of a thread each: a rank gets a quarter while all compute, a core (half) while 2 or fewer do.
  std::string two_cores = measured;
  two_cores.replace(two_cores.find("shared_host = true"), 18, "shared_host = true\ncores = 2");
  const sched::HardwareProfile cores = sched::parse_hardware(two_cores, "test");
  EXPECT_EQ(cores.host_cores, 2);
  EXPECT_EQ(cores.busy_share(4, 4), 0.25);
  EXPECT_EQ(cores.busy_share(4, 3), 1.0 / 3);
  EXPECT_EQ(cores.busy_share(4, 2), 0.5);
  EXPECT_EQ(cores.busy_share(4, 1), 0.5);
  EXPECT_EQ(cores.busy_share(1, 1), 1);
  std::string cores_not_shared = two_cores;
  cores_not_shared.replace(cores_not_shared.find("shared_host = true"), 18, "shared_host = false");
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(cores_not_shared, "test"); }),
                       "device.cores is for ranks that share a host's cores"));
  EXPECT_TRUE(
      contains(message_of([&] { sched::parse_hardware("colour = 1\n" + measured, "test"); }), "colour unknown"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(measured + "colour = 1\n", "test"); }),
                       "collectives.table.colour unknown"));
  EXPECT_TRUE(contains(message_of([] { sched::parse_hardware("name = \"x\"\n[device]\nmemory_gbps = 1\n", "f.toml"); }),
                       "hardware profile f.toml: device.peak_gflops_f32 is required"));
  // Numbers no device has: errors naming the key and the value, not infinite times.
  const std::string nccl = "name = \"x\"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 20\n[collectives]\n";
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(nccl + "intra_bus_gbps = 1e-300\n", "f.toml"); }),
                       "collectives.intra_bus_gbps must be a number of at least 1e-06 and at most 1e+12, got 1e-300"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(nccl + "inter_gbps = nan\n", "f.toml"); }),
                       "collectives.inter_gbps must be a number of at least 1e-06 and at most 1e+12, got nan"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(nccl + "channels = 1e30\n", "f.toml"); }),
                       "collectives.channels must be an integer from 1 to 1024"));
  std::string infinite = measured;
  infinite.replace(infinite.find("us = [5, 15]"), 12, "us = [5, inf]");
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(infinite, "t"); }),
                       "must hold numbers from 0 to 1e+12, not inf"));
  const std::string twice = measured + measured.substr(measured.find("[[collectives.table]]"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(twice, "t"); }),
                       "all_reduce over 2 ranks in a job of any size: given twice"));
  std::string tiny_step = measured;
  tiny_step.replace(tiny_step.find("bytes = [0, 1000]"), 17, "bytes = [0, 1e-300]");
  EXPECT_TRUE(
      contains(message_of([&] { sched::parse_hardware(tiny_step, "t"); }), "sizes must increase, by a byte at least"));
}

// The memory estimate of a schedule: what the executor allocates is the
// inputs and the plan's arena; at the peak, the live values by kind.
TEST(MemoryEstimate, PeakIsTheInputsAndTheArenaWithWhatIsLiveByKind) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 64}, DType::f32);  // 16 KiB
  const ValueId w = g.add_parameter("w", {64, 64}, DType::f32);
  const ValueId h = b.matmul(x, w, false, false);  // 16 KiB
  const ValueId a = b.silu(h);                     // 16 KiB, h still read below
  g.add_output(b.add(a, h));                       // 16 KiB: h, a and the sum live together
  const Schedule s = sched::make_schedule(g, g.outputs());
  const sched::MemoryEstimate e = sched::estimate_memory(g, s);
  const double kib16 = 16384;
  EXPECT_EQ(e.input_bytes, 2 * kib16);
  EXPECT_EQ(e.arena_bytes, static_cast<double>(s.memory.peak_bytes));
  EXPECT_EQ(e.peak_bytes, e.input_bytes + e.arena_bytes);
  ASSERT_EQ(e.live_bytes.size(), 3u);
  EXPECT_EQ(e.live_bytes, (std::vector<double>{3 * kib16, 4 * kib16, 5 * kib16}));
  EXPECT_EQ(e.peak_step, 2u);
  EXPECT_EQ(e.at_peak.at(sched::MemoryKind::parameters), kib16);
  EXPECT_EQ(e.at_peak.at(sched::MemoryKind::other), kib16);  // the input x
  EXPECT_EQ(e.at_peak.at(sched::MemoryKind::activations), 3 * kib16);
  double sum = e.arena_unused_at_peak;
  for (const auto& [kind, bytes] : e.at_peak) sum += bytes;
  EXPECT_EQ(sum, e.peak_bytes);
  // A caller's kinds win.
  const sched::MemoryEstimate mine = sched::estimate_memory(g, s, [&](ValueId v) -> std::optional<sched::MemoryKind> {
    if (v == h) return sched::MemoryKind::gradients;
    return std::nullopt;
  });
  EXPECT_EQ(mine.at_peak.at(sched::MemoryKind::gradients), kib16);
  EXPECT_EQ(mine.at_peak.at(sched::MemoryKind::activations), 2 * kib16);
}

// A training step's estimate on one rank: its inputs are the f32 parameters,
// their two f32 moments and the batch, and its FLOPs per token and MFU, all
// counted by hand from the config (not with the code's own sums).
TEST(TrainingEstimate, InputsAreTheParametersStatesAndBatch) {
  config::TrainConfig c;
  c.model = {.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64, .vocab_size = 64};
  c.data.batch_size = 2;
  c.data.seq_len = 16;
  const sched::HardwareProfile h100 = sched::builtin_hardware("h100-sxm");
  const estimate::TrainingEstimate e = estimate::estimate_training(c, 1, 0, h100);
  // head_dim 8, k and v 2 x 8 = 16 wide. A layer: q 32 x 32 = 1024, k and v
  // 16 x 32 = 512 each, o 1024, gate, up and down 64 x 32 = 2048 each, two
  // norms of 32: 9280. Two layers 18560, the embedding and the untied lm_head
  // 64 x 32 = 2048 each, the final norm 32: 22688 parameters.
  const double params = 22688;
  const double batch = 2 * (2 * 16 * 8) + 8 + 8;  // tokens and targets (i64), lr (f64) and step (i64)
  EXPECT_EQ(e.memory.input_bytes, 4 * params + 8 * params + batch);
  EXPECT_EQ(e.memory.at_peak.at(sched::MemoryKind::parameters), 4 * params);
  EXPECT_EQ(e.memory.at_peak.at(sched::MemoryKind::optimizer_states), 8 * params);
  EXPECT_GT(e.time.step_us, 0);
  EXPECT_EQ(e.collectives, 0u);
  // torchtitan's FLOPs per token: 6 x the 20640 parameters but the
  // embedding's + 12 x 2 layers x 4 heads x head_dim 8 x 16 tokens =
  // 123840 + 12288.
  EXPECT_EQ(e.flops_per_token, 136128);
  EXPECT_EQ(estimate::torchtitan_flops_per_token(c.model, 16), 136128);
  // MFU: the step's 2 x 16 tokens' FLOPs over the step's time at the H100's
  // dense f32 peak (66.9 TFLOP/s); tokens/s on the one device.
  const double step_s = e.time.step_us * 1e-6;
  EXPECT_DOUBLE_EQ(e.tokens_per_step, 32);
  EXPECT_DOUBLE_EQ(e.tokens_per_s_per_device, 32 / step_s);
  EXPECT_DOUBLE_EQ(e.peak_gflops, 66900);
  EXPECT_NEAR(e.mfu, 136128.0 * 32 / step_s / 66.9e12, 1e-12 * e.mfu);
  // On 2 ranks (FSDP 2) each device does half the tokens of a step.
  const estimate::TrainingEstimate two = estimate::estimate_training(c, 2, 0, h100);
  const double two_s = two.time.step_us * 1e-6;
  EXPECT_DOUBLE_EQ(two.tokens_per_s_per_device, 16 / two_s);
  EXPECT_NEAR(two.mfu, 136128.0 * 16 / two_s / 66.9e12, 1e-12 * two.mfu);
  EXPECT_TRUE(contains(message_of([&] { estimate::estimate_training(c, 3, 0, h100); }), "parallel"));
}

// What a step allocates, estimated without running it, against a real step
// of the trainer on this rank: the same bytes, up to the allocator's
// rounding of each block (512 B granules, 128 KiB above 1 MiB).
TEST(TrainingEstimate, PeakIsWhatATrainerStepAllocates) {
  config::TrainConfig c;
  c.model = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 128, .vocab_size = 256};
  c.data.path = std::string(MESHTRAIN_SOURCE_DIR) + "/data/corpus.txt";
  c.data.batch_size = 4;
  c.data.seq_len = 32;
  c.training.steps = 2;
  const estimate::TrainingEstimate e = estimate::estimate_training(c, 1, 0, sched::builtin_hardware("h100-sxm"));
  train::Trainer trainer(c);
  trainer.step();
  const double measured = static_cast<double>(trainer.step().step_peak_bytes);
  // The arena is one block over 1 MiB: up to one 128 KiB granule more.
  EXPECT_NEAR(measured, e.memory.peak_bytes, 0.01 * e.memory.peak_bytes + 128 * 1024)
      << "estimated " << e.memory.peak_bytes;
  EXPECT_GE(measured, e.memory.peak_bytes);  // rounding only adds
}

// Activation checkpointing recomputes, never changes a result: three steps
// of a 2-layer Llama give bitwise the same losses and gradient norms with
// none, full, selective and selective keeping every other matmul (with 2
// microbatches, whose block passes are each their own); full needs less
// memory than selective with every other matmul (as much with 2
// microbatches, whose peak lies elsewhere), that less than selective, and
// selective less than none; each step allocates what the estimate says.
TEST(ActivationCheckpoint, SameResultsLessMemoryAsEstimated) {
  using Mode = sched::ActivationCheckpoint;
  using Matmuls = sched::SelectiveMatmuls;
  struct Policy {
    Mode mode;
    Matmuls matmuls;
    bool operator<(const Policy& o) const { return std::tie(mode, matmuls) < std::tie(o.mode, o.matmuls); }
  };
  const Policy none{Mode::none, Matmuls::all}, full{Mode::full, Matmuls::all}, selective{Mode::selective, Matmuls::all},
      every_other{Mode::selective, Matmuls::every_other};
  std::map<std::pair<int64_t, Policy>, std::vector<std::pair<double, double>>> results;  // (microbatches, policy)
  std::map<std::pair<int64_t, Policy>, double> peaks;
  for (const int64_t micro_batches : {1, 2}) {
    for (const Policy policy : {none, full, selective, every_other}) {
      SCOPED_TRACE(fmt::format("{} ({} matmuls), {} microbatches", sched::activation_checkpoint_name(policy.mode),
                               sched::selective_matmuls_name(policy.matmuls), micro_batches));
      config::TrainConfig c;
      c.model = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 128, .vocab_size = 256};
      c.data.path = std::string(MESHTRAIN_SOURCE_DIR) + "/data/corpus.txt";
      c.data.batch_size = 4;
      c.data.seq_len = 64;
      c.training.steps = 3;
      c.training.grad_accum_steps = micro_batches;
      c.activation_checkpoint.mode = policy.mode;
      c.activation_checkpoint.selective_matmuls = policy.matmuls;
      const estimate::TrainingEstimate e = estimate::estimate_training(c, 1, 0, sched::builtin_hardware("h100-sxm"));
      train::Trainer trainer(c);
      std::vector<std::pair<double, double>> steps;
      double peak = 0;
      for (int s = 0; s < 3; ++s) {
        const train::StepMetrics m = trainer.step();
        steps.emplace_back(m.loss, m.grad_norm);
        peak = std::max(peak, static_cast<double>(m.step_peak_bytes));
      }
      EXPECT_NEAR(peak, e.memory.peak_bytes, 0.01 * e.memory.peak_bytes + 128 * 1024);
      results[{micro_batches, policy}] = steps;
      peaks[{micro_batches, policy}] = peak;
    }
    SCOPED_TRACE(fmt::format("{} microbatches", micro_batches));
    for (const Policy policy : {full, selective, every_other})
      EXPECT_EQ(results.at({micro_batches, policy}), results.at({micro_batches, none}));
    EXPECT_LE(peaks.at({micro_batches, full}), peaks.at({micro_batches, every_other}));
    if (micro_batches == 1) {
      EXPECT_LT(peaks.at({micro_batches, full}), peaks.at({micro_batches, every_other}));
    }
    EXPECT_LT(peaks.at({micro_batches, every_other}), peaks.at({micro_batches, selective}));
    EXPECT_LT(peaks.at({micro_batches, selective}), peaks.at({micro_batches, none}));
  }
}

// Benchmark mode: a compute node whose kernel key has a measured time costs
// that time, whatever the roofline says; one the table lacks keeps the
// roofline. The key names the op, its shapes, dtypes and attributes.
TEST(BenchmarkMode, MeasuredKernelTimesReplaceTheRoofline) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 32}, DType::f32), w = g.add_input("w", {32, 16}, DType::f32);
  const ValueId y = b.matmul(x, w);
  const NodeId mm = g.value(y).producer, relu_node = g.value(b.silu(y)).producer;
  const std::string key = sched::kernel_key(g, mm);
  EXPECT_EQ(key, "matmul((64, 32):f32, (32, 16):f32)->((64, 16):f32) {transpose_a=false, transpose_b=false}");
  const sched::HardwareProfile cpu = sched::builtin_hardware("cpu-2core");
  sched::KernelTimes times;
  times.us[key] = 1234.5;
  const sched::RankDevice roofline{cpu, 1}, measured{cpu, 1, &times};
  EXPECT_EQ(sched::node_us(g, mm, measured), 1234.5);
  EXPECT_NE(sched::node_us(g, mm, roofline), 1234.5);
  EXPECT_EQ(sched::node_us(g, relu_node, measured), sched::node_us(g, relu_node, roofline));
}

// A ring shift (context parallelism's ring) costs one neighbour's transfer:
// one step of a two-rank ring all_gather of both blocks, within a host on
// NVLink and across hosts on InfiniBand, whatever the group's size.
TEST(Estimate, RingShiftCostsOneNeighboursTransfer) {
  const sched::HardwareProfile h100 = sched::builtin_hardware("h100-sxm");
  for (const std::vector<int64_t>& group : {std::vector<int64_t>{0, 1, 2, 3}, std::vector<int64_t>{0, 8}}) {
    Graph g;
    Builder b(g);
    const ValueId x = g.add_input("x", {1024, 1024}, DType::bf16);
    const double bytes = 2.0 * 1024 * 1024;
    const NodeId shift =
        g.add_node("ring_shift", {x}, {attr::mesh_dims({0}), attr::group(group), attr::comm_bytes(bytes)});
    const double us = sched::node_us(g, shift, {h100, 16});
    EXPECT_DOUBLE_EQ(us, h100.collective_us(comm::OpType::all_gather, 2 * bytes, {group[0], group[1]}, 16));
    EXPECT_GT(us, bytes / (group[1] < 8 ? h100.nccl.intra_bus_gbps : h100.nccl.inter_gbps) * 1e-3);
  }
}

// The kernels of a graph are timed once per key (two matmuls of one shape
// share a figure), each for its timing window, each a positive time; what the table has is not timed
// again; the cache file round-trips, and a malformed one is an error naming it.
TEST(BenchmarkMode, TimesEachKernelOnceAndCachesToAFile) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 32}, DType::f32), w = g.add_input("w", {32, 32}, DType::f32);
  const ValueId y = b.matmul(b.matmul(x, w), w);
  g.add_output(b.silu(y));
  const std::vector<std::string> keys = estimate::measurable_kernels(g);
  ASSERT_EQ(keys.size(), 2u);  // matmul (twice, one key) and silu
  sched::KernelTimes times;
  const estimate::KernelBenchmark first = estimate::measure_kernels(g, times);
  EXPECT_EQ(first.measured, 2);
  EXPECT_EQ(first.known, 0);
  EXPECT_GE(first.seconds, 2 * 0.020);  // each kernel called for its whole window (20 ms by default)
  for (const std::string& key : keys) EXPECT_GT(times.find(key).value_or(0), 0) << key;
  const estimate::KernelBenchmark again = estimate::measure_kernels(g, times);
  EXPECT_EQ(again.measured, 0);
  EXPECT_EQ(again.known, 2);

  const std::string path = ::testing::TempDir() + "/kernel_cache_test.json";
  times.sync_lateness.tables[{4, 4}] = {{.interval_us = 10000, .share = 0.25}, {.interval_us = 20000, .share = 0.125}};
  sched::save_kernel_times(times, path);
  const sched::KernelTimes loaded = sched::load_kernel_times(path);
  EXPECT_EQ(loaded.us, times.us);
  EXPECT_EQ(loaded.sync_lateness.tables, times.sync_lateness.tables);
  const auto cache_error = [&](const std::string& lateness) {
    { std::ofstream(path) << R"({"kernels": {}, "sync_lateness": )" << lateness << "}"; }
    return message_of([&] { sched::load_kernel_times(path); });
  };
  const std::string unordered = cache_error(R"([{"world": 4, "ranks": 4, "interval_us": [2, 1], "share": [0, 0]}])");
  EXPECT_TRUE(contains(unordered, path) && contains(unordered, "intervals must be positive and increase")) << unordered;
  EXPECT_TRUE(contains(cache_error(R"([{"world": 4, "ranks": 1e30, "interval_us": [1], "share": [0]}])"),
                       "ranks must be an integer from 2 to 16777216"));
  EXPECT_TRUE(contains(cache_error(R"([{"world": 2, "ranks": 4, "interval_us": [1], "share": [0]}])"),
                       "need 2 <= ranks <= world"));
  EXPECT_TRUE(contains(cache_error("{}"), "sync_lateness is not an array"));
  const std::string twice = R"({"world": 4, "ranks": 4, "interval_us": [1], "share": [0]})";
  EXPECT_TRUE(contains(cache_error("[" + twice + ", " + twice + "]"), "in a job of 4 twice"));
  EXPECT_TRUE(sched::load_kernel_times(path + ".absent").us.empty());
  { std::ofstream(path) << "{\"kernels\": {\"matmul\": \"fast\"}}"; }
  const std::string error = message_of([&] { sched::load_kernel_times(path); });
  EXPECT_TRUE(contains(error, path) && contains(error, "delete it")) << error;
  std::filesystem::remove(path);
}

// Alignment across ranks: every rank ends with the median of the ranks'
// figures for each key (the lower middle one for an even count), so all
// cost a kernel alike; a key only some ranks have takes the median of those.
TEST(BenchmarkMode, RanksAgreeOnTheMedian) {
  comm::LocalWorld world(4);
  std::vector<sched::KernelTimes> after(4);
  world.run([&](comm::ProcessGroup& pg) {
    sched::KernelTimes times;
    const int r = pg.rank();
    times.us["shared"] = 10.0 * (r + 1);  // 10, 20, 30, 40: lower median 20
    std::vector<std::string> keys{"shared"};
    if (r % 2 == 1) {  // ranks 1 and 3 only: 100 and 300
      times.us["odd"] = 100.0 * r;
      keys.push_back("odd");
    }
    estimate::align_kernel_times(times, keys, pg);
    after[static_cast<size_t>(r)] = times;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(after[r].us.at("shared"), 20.0) << "rank " << r;
    if (r % 2 == 1) {
      EXPECT_EQ(after[r].us.at("odd"), 100.0) << "rank " << r;
    }
  }
}

// Ranks sharing cores advance unevenly: per group size and stretch length,
// the slowest member's time less the group's mean, summed, over the mean,
// summed (by hand below); longer stretches are sums of whole windows.
TEST(BenchmarkMode, LatenessIsHowFarAGroupsSlowestRankTrails) {
  // Per call, eight windows per rank: ranks 1 and 2 are slow in every other one.
  std::vector<double> per_rank;
  for (const std::vector<double>& two : {std::vector<double>{10, 10}, {20, 10}, {10, 30}, {10, 10}})
    for (int i = 0; i < 4; ++i) per_rank.insert(per_rank.end(), two.begin(), two.end());
  const std::vector<std::vector<int64_t>> groups{{0, 1}, {2, 3}, {0, 1, 2, 3}};
  const auto lateness = estimate::sync_lateness_of(per_rank, 4, 8, groups, 1000);
  ASSERT_EQ(lateness.tables.size(), 2u);
  const auto& pairs = lateness.tables.at({4, 2});
  const auto& all = lateness.tables.at({4, 4});
  ASSERT_EQ(pairs.size(), 2u);  // stretches of 1 and 2 windows: 4 would be seen only twice
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(pairs[0].interval_us, 1000);
  EXPECT_EQ(pairs[1].interval_us, 2000);
  // One window: pairs trail by (20-15) + 0 + 0 + (30-20) over 15+10+10+20.
  EXPECT_NEAR(pairs[0].share, 15.0 / 55, 1e-12);
  // Two windows: (30-25) + (40-30) over 25+30.
  EXPECT_NEAR(pairs[1].share, 15.0 / 55, 1e-12);
  // All four, one window: (20-12.5) + (30-15) over 12.5+15; two: (40-27.5) over 27.5.
  EXPECT_NEAR(all[0].share, 22.5 / 27.5, 1e-12);
  EXPECT_NEAR(all[1].share, 12.5 / 27.5, 1e-12);
  EXPECT_TRUE(contains(message_of([&] {
                         estimate::sync_lateness_of(per_rank, 4, 8, {{0, 4}}, 1000);
                       }),
                       "rank 4 is not in the world of 4"));
  EXPECT_TRUE(contains(message_of([&] { estimate::sync_lateness_of(per_rank, 3, 8, groups, 1000); }),
                       "32 figures for 3 ranks of 8 windows"));

  // The wait after computing a stretch: the share there (linear between the
  // measured stretches, the nearest one's outside them) times the stretch;
  // a size not measured takes the next larger one's, else the largest's; a
  // job of another size, or a group of one, waits for nothing.
  sched::KernelTimes times;
  EXPECT_EQ(times.sync_lateness.us(4, 2, 5000), 0);  // nothing measured
  times.sync_lateness = lateness;
  EXPECT_NEAR(times.sync_lateness.us(4, 4, 500), 500 * 22.5 / 27.5, 1e-9);
  EXPECT_NEAR(times.sync_lateness.us(4, 4, 1500), 1500 * (17.5 / 27.5), 1e-9);
  EXPECT_NEAR(times.sync_lateness.us(4, 4, 8000), 8000 * 12.5 / 27.5, 1e-9);
  EXPECT_NEAR(times.sync_lateness.us(4, 3, 1000), 1000 * 22.5 / 27.5, 1e-9);
  EXPECT_NEAR(times.sync_lateness.us(4, 8, 1000), 1000 * 22.5 / 27.5, 1e-9);
  EXPECT_NEAR(times.sync_lateness.us(4, 2, 1000), 1000 * 15.0 / 55, 1e-9);
  EXPECT_EQ(times.sync_lateness.us(4, 2, 0), 0);
  EXPECT_EQ(times.sync_lateness.us(2, 2, 1000), 0);
  EXPECT_EQ(times.sync_lateness.us(8, 4, 1000), 0);
  EXPECT_EQ(times.sync_lateness.us(4, 1, 1000), 0);
  // Measured figures over a profile's: per key, the profile's where they lack one.
  sched::SyncLateness profile;
  profile.tables[{4, 2}] = {{.interval_us = 1000, .share = 0.5}};
  profile.tables[{2, 2}] = {{.interval_us = 1000, .share = 0.25}};
  sched::SyncLateness measured_four;
  measured_four.tables[{4, 4}] = all;
  const sched::SyncLateness both = measured_four.over(profile);
  EXPECT_NEAR(both.us(4, 2, 1000), 500, 1e-9);
  EXPECT_NEAR(both.us(2, 2, 1000), 250, 1e-9);
  EXPECT_NEAR(both.us(4, 4, 1000), 1000 * 22.5 / 27.5, 1e-9);
  EXPECT_EQ(lateness.over(profile).tables.at({4, 2}), pairs);
}

// Measured side by side on ranks that share this machine's cores: every rank
// ends with the same figures, one per stretch of 1, 2, 4, ... windows, each
// twice as long as the last, a window lasting about what was asked (its end
// is fixed; a 64 x 64 matmul overruns it by microseconds).
TEST(BenchmarkMode, RanksMeasureTheSameLateness) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 64}, DType::f32);
  g.add_output(b.silu(b.matmul(x, x)));
  comm::LocalWorld world(2);
  std::vector<sched::SyncLateness> measured(2);
  world.run([&](comm::ProcessGroup& pg) {
    measured[static_cast<size_t>(pg.rank())] =
        estimate::measure_sync_lateness(g, {{0, 1}}, pg, {.window = std::chrono::milliseconds(1)}, 16);
  });
  ASSERT_EQ(measured[0].tables.size(), 1u);
  const auto& points = measured[0].tables.at({2, 2});
  ASSERT_EQ(points.size(), 3u);  // 1, 2 and 4 windows, each length seen at least 4 times
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].interval_us, points[0].interval_us * static_cast<double>(1 << i));
    EXPECT_EQ(points[i].share, measured[1].tables.at({2, 2})[i].share);
  }
  EXPECT_GE(points[0].interval_us, 1000);
  EXPECT_LT(points[0].interval_us, 20000);  // loose: a loaded machine may preempt a rank
}

// Benchmark mode costs this machine's kernels, so it needs a profile of this
// machine: an H100 profile is refused with what to do instead. On one with
// cached figures, `meshtrain estimate` takes them as they are.
TEST(BenchmarkMode, EstimateUsesTheCacheAndRefusesOtherHardware) {
  config::TrainConfig c;
  c.model = {.dim = 32, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64, .vocab_size = 64};
  c.data.batch_size = 2;
  c.data.seq_len = 16;
  c.schedule.estimate = config::EstimateMode::benchmark;
  const std::string refused =
      message_of([&] { estimate::estimate_training(c, 1, 0, sched::builtin_hardware("h100-sxm")); });
  EXPECT_TRUE(contains(refused, "h100-sxm") && contains(refused, "roofline")) << refused;

  c.schedule.kernel_cache = ::testing::TempDir() + "/estimate_kernel_cache.json";
  std::filesystem::remove(c.schedule.kernel_cache);
  const sched::HardwareProfile cpu = sched::builtin_hardware("cpu-2core");
  const estimate::TrainingEstimate timed = estimate::estimate_training(c, 1, 0, cpu);
  sched::KernelTimes cached = sched::load_kernel_times(c.schedule.kernel_cache);
  ASSERT_FALSE(cached.us.empty());
  // Every kernel costed 1 ms in the cache: the step is 1 ms per compute node that has a kernel.
  for (auto& [key, us] : cached.us) us = 1000;
  sched::save_kernel_times(cached, c.schedule.kernel_cache);
  const estimate::TrainingEstimate from_cache = estimate::estimate_training(c, 1, 0, cpu);
  graph::Graph g;
  compile::build_step(c, g);
  size_t kernels = 0;
  for (graph::NodeId n : g.order())
    if (!g.node(n).op->is_view && !g.node(n).op->is_collective) ++kernels;
  EXPECT_NEAR(from_cache.time.compute_us, 1000.0 * static_cast<double>(kernels), 1e-6);
  EXPECT_GT(timed.time.step_us, 0);
  std::filesystem::remove(c.schedule.kernel_cache);
}

namespace {
// The makespan of 1F1B over 2 stages on 2 ranks, `m` microbatches, worked
// out by hand: rank 0 runs F0, then F(i+1) and B(i) in turn, then the last
// B; rank 1 runs F(i), B(i) in turn. F(i) on rank 1 waits for rank 0's F(i)
// and the hop `to_next`; B(i) on rank 0 waits for rank 1's B(i) and the hop
// `to_previous`. F and B are each stage's costs for one microbatch.
double two_stage_1f1b_makespan(double f0, double b0, double f1, double b1, double to_next, double to_previous, int m) {
  std::vector<double> forward0(static_cast<size_t>(m));
  double rank0 = f0, rank1 = 0;
  forward0[0] = f0;
  for (int i = 0; i < m; ++i) {
    rank1 = std::max(rank1, forward0[static_cast<size_t>(i)] + to_next) + f1 + b1;  // F(i) and B(i) on rank 1
    if (i + 1 < m) rank0 = forward0[static_cast<size_t>(i + 1)] = rank0 + f0;       // F(i + 1) on rank 0
    rank0 = std::max(rank0, rank1 + to_previous) + b0;                              // B(i) on rank 0
  }
  return std::max(rank0, rank1);
}
}  // namespace

namespace {
// Two layers of dim 1024 (GQA 8/4, ffn 2048, vocab 4096), batch 8 x seq 512:
// the pipelines below count its parameters by hand.
config::TrainConfig two_layer_config() {
  config::TrainConfig c;
  c.model = {.dim = 1024, .n_layers = 2, .n_heads = 8, .n_kv_heads = 4, .ffn_dim = 2048, .vocab_size = 4096};
  c.data.batch_size = 8;
  c.data.seq_len = 512;
  return c;
}
}  // namespace

// A pipeline's estimate (PP 2 on 2 ranks, 4 microbatches): its stages'
// forward and backward over the microbatches add up to the compute of the
// same step on one rank accumulating the microbatches; the step is the 1F1B
// timeline worked out by hand from the stages' costs, and the update's
// memory traffic; the parameters and moments are this rank's stage's alone,
// counted by hand.
TEST(TrainingEstimate, PipelineStagesAddUpToTheWholeStep) {
  config::TrainConfig c = two_layer_config();
  c.training.grad_accum_steps = 4;
  const sched::HardwareProfile h100 = sched::builtin_hardware("h100-sxm");
  const estimate::TrainingEstimate whole = estimate::estimate_training(c, 1, 0, h100);
  c.training.grad_accum_steps = 1;
  c.parallel.pp = 2;
  c.parallel.pp_microbatches = 4;
  const estimate::TrainingEstimate e = estimate::estimate_training(c, 2, 0, h100);
  ASSERT_TRUE(e.pipeline.has_value());
  const estimate::PipelineEstimate& p = *e.pipeline;
  ASSERT_EQ(p.forward_us.size(), 2u);
  double compute = 0;
  for (size_t s = 0; s < 2; ++s) compute += 4 * (p.forward_us[s] + p.backward_input_us[s] + p.backward_weight_us[s]);
  EXPECT_NEAR(compute + 2 * p.update_us, whole.time.compute_us, 0.1 * whole.time.compute_us);
  EXPECT_GT(p.makespan_us, p.rank_busy_us);
  EXPECT_GT(p.bubble_fraction, 0);
  EXPECT_LT(p.bubble_fraction, 0.5);
  EXPECT_EQ(p.p2p_us[1], 0);  // the last stage sends nothing on
  EXPECT_GT(p.p2p_us[0], 0);
  // Rank 0 holds the embedding (4096 x 1024 = 4194304), layer 0 (q and o
  // 1024 x 1024, k and v 512 x 1024, gate, up and down 2048 x 1024, two norms
  // of 1024: 9439232) and, with 4 units over 2 stages, nothing of the head.
  const double params = 4194304 + 9439232;
  EXPECT_EQ(e.memory.at_peak.at(sched::MemoryKind::optimizer_states), 8 * params);
  // No data parallelism: nothing to gather or reduce. The update streams 40
  // bytes a parameter: the f32 parameter read and written, its gradient read
  // by the norm, read and written by clipping and read by AdamW (6 x 4), m and
  // v read and written (4 x 4); at 75% of the H100's 3350 GB/s.
  EXPECT_EQ(p.unshard_us, 0);
  EXPECT_EQ(p.reduce_grad_us, 0);
  const double update_us = 40 * params / (3350e3 * 0.75);
  EXPECT_NEAR(p.update_us, update_us, 1e-9 * update_us);
  // The step: the 1F1B timeline of the stages' costs, the activation and its
  // gradient each crossing the one link (p2p_us[0]), then the update.
  const auto makespan = [](const estimate::PipelineEstimate& pe, int m) {
    return two_stage_1f1b_makespan(pe.forward_us[0], pe.backward_input_us[0] + pe.backward_weight_us[0],
                                   pe.forward_us[1], pe.backward_input_us[1] + pe.backward_weight_us[1], pe.p2p_us[0],
                                   pe.p2p_us[0], m);
  };
  const double busy0 = 4 * (p.forward_us[0] + p.backward_input_us[0] + p.backward_weight_us[0]);
  EXPECT_NEAR(p.makespan_us, makespan(p, 4), 1e-9 * p.makespan_us);
  EXPECT_NEAR(e.time.step_us, makespan(p, 4) + update_us, 1e-9 * e.time.step_us);
  EXPECT_NEAR(e.time.compute_us, busy0 + update_us, 1e-9 * e.time.compute_us);
  EXPECT_EQ(p.peak_activation_pairs, 2);  // 1F1B: rank 0 of 2 holds 2 microbatches at once
  EXPECT_GT(p.activation_bytes_per_pair, 0);
  EXPECT_TRUE(contains(message_of([&] { estimate::estimate_training(c, 2, 0, h100, true); }), "--trace"));
  // Accumulating 2 chunks of 2 microbatches: the schedule of 2 runs twice; the once-a-step work once.
  c.parallel.pp_microbatches = 2;
  c.training.grad_accum_steps = 2;
  const estimate::TrainingEstimate twice = estimate::estimate_training(c, 2, 0, h100);
  ASSERT_TRUE(twice.pipeline.has_value());
  const estimate::PipelineEstimate& q = *twice.pipeline;
  EXPECT_EQ(q.runs, 2);
  EXPECT_NEAR(twice.time.step_us, 2 * makespan(q, 2) + update_us, 1e-9 * twice.time.step_us);
  EXPECT_NEAR(twice.time.compute_us,
              2 * 2 * (q.forward_us[0] + q.backward_input_us[0] + q.backward_weight_us[0]) + update_us,
              1e-9 * twice.time.compute_us);
  EXPECT_NEAR(twice.time.compute_us, e.time.compute_us, 0.02 * e.time.compute_us);  // the same microbatches
  EXPECT_GT(twice.time.step_us, e.time.step_us);                                    // two runs' bubbles
  // FSDP 2 under interleaved 1F1B (2 stages a rank): at most one stage gathered at once holds less and gathers more.
  c.training.grad_accum_steps = 1;
  c.model.n_layers = 6;  // 8 units: each of the 4 stages holds a layer to gather at least
  c.parallel.pp_microbatches = 4;
  c.parallel.pp_schedule = parallel::PpScheduleKind::interleaved_1f1b;
  const estimate::TrainingEstimate both = estimate::estimate_training(c, 4, 0, h100);
  c.parallel.pp_max_active_stages = 1;
  const estimate::TrainingEstimate one_at_a_time = estimate::estimate_training(c, 4, 0, h100);
  EXPECT_LT(one_at_a_time.memory.at_peak.at(sched::MemoryKind::parameters),
            both.memory.at_peak.at(sched::MemoryKind::parameters));
  EXPECT_GT(one_at_a_time.pipeline->unshard_us, 1.5 * both.pipeline->unshard_us);
}

// The pipeline runner's copies (PP 2 on 2 ranks, GPipe, 4 microbatches, no
// data parallelism), counted by hand for rank 0's stage: per microbatch its
// forward's outputs copied out (what the stage holds from the forward to
// the backward, activation_bytes_per_pair, less the token ids the runner
// gave the forward: 2 sequences x 512 int64), its backward's
// outputs (every gradient) copied out and each gradient added into the
// sums (two reads and a write), each byte read and written at 75% of the
// H100's 3350 GB/s. They are part of the stage's action times.
TEST(TrainingEstimate, PipelineRunnerCopiesAtMemoryBandwidth) {
  config::TrainConfig c = two_layer_config();
  c.parallel.pp = 2;
  c.parallel.pp_microbatches = 4;
  c.parallel.pp_schedule = parallel::PpScheduleKind::gpipe;
  sched::HardwareProfile h100 = sched::builtin_hardware("h100-sxm");
  const estimate::TrainingEstimate e = estimate::estimate_training(c, 2, 0, h100);
  ASSERT_TRUE(e.pipeline.has_value());
  const estimate::PipelineEstimate& p = *e.pipeline;
  const double params = 4194304 + 9439232;   // the embedding and layer 0 (see above)
  const double sent = 2.0 * 512 * 1024 * 4;  // 2 sequences x 512 x 1024 f32
  EXPECT_GT(p.activation_bytes_per_pair, sent);
  const double tokens = 2.0 * 512 * 8;
  const double bytes = 4 * (2 * (p.activation_bytes_per_pair - tokens) + (2 + 3) * 4 * params);
  EXPECT_NEAR(p.copy_us, bytes / (3350e3 * 0.75), 1e-6 * p.copy_us);
  // Half the bandwidth: twice the copies, the programs' own time as it was.
  h100.memory_gbps /= 2;
  const estimate::TrainingEstimate slower = estimate::estimate_training(c, 2, 0, h100);
  EXPECT_NEAR(slower.pipeline->copy_us, 2 * p.copy_us, 1e-9 * p.copy_us);
}

// Ranks sharing a host's cores (cpu-2core, 4 ranks, DP 2 x PP 2): under
// GPipe with one microbatch a single stage computes at a time, so its 2
// ranks each get a core (half the host) instead of a quarter: every action
// runs twice as fast, the hops do not. A plan without a pipeline keeps
// every rank computing and costs the same.
TEST(TrainingEstimate, PipelineStagesSharingCoresComputeFasterInTheBubble) {
  config::TrainConfig c;
  c.model = {.dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 256, .vocab_size = 512};
  c.data.batch_size = 4;
  c.data.seq_len = 64;
  c.parallel.dp_shard = 4;
  sched::HardwareProfile unknown = sched::builtin_hardware("cpu-2core");
  unknown.host_cores = 0;
  // Without lateness: with it, the cores also speed a slowest rank's catching up.
  unknown.sync_lateness = {};
  sched::HardwareProfile two = unknown;
  two.host_cores = 2;
  EXPECT_EQ(estimate::estimate_training(c, 4, 0, two).time.step_us,
            estimate::estimate_training(c, 4, 0, unknown).time.step_us);
  c.parallel.dp_shard = 1;
  c.parallel.dp_replicate = 2;
  c.parallel.pp = 2;
  c.parallel.pp_schedule = parallel::PpScheduleKind::gpipe;
  c.parallel.pp_microbatches = 1;
  const estimate::TrainingEstimate plain = estimate::estimate_training(c, 4, 0, unknown);
  const estimate::TrainingEstimate shared = estimate::estimate_training(c, 4, 0, two);
  ASSERT_TRUE(plain.pipeline && shared.pipeline);
  const double hops = 2 * plain.pipeline->p2p_us[0];
  EXPECT_NEAR(shared.pipeline->makespan_us, (plain.pipeline->makespan_us - hops) / 2 + hops,
              1e-9 * plain.pipeline->makespan_us);
  EXPECT_NEAR(shared.pipeline->rank_busy_us, plain.pipeline->rank_busy_us / 2, 1e-9 * plain.pipeline->rank_busy_us);
}

// A pipeline stage's collectives run while the other stages compute: on a
// shared host they cost the profile's tables measured so (cpu-2core, 4
// ranks, TP 2 x PP 2, GPipe: the TP collectives inside each program). With
// those tables (cpu-2core's own dropped) 1 ms above the plain ones, each
// program's collectives cost 1 ms more each; a plan without a pipeline (TP 2
// x DP 2) costs as before.
TEST(TrainingEstimate, PipelineStageCollectivesCostTheTablesBesideCompute) {
  config::TrainConfig c;
  c.model = {.dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 256, .vocab_size = 512};
  c.data.batch_size = 4;
  c.data.seq_len = 64;
  c.parallel.dp_shard = 2;
  c.parallel.tp = 2;
  sched::HardwareProfile plain = sched::builtin_hardware("cpu-2core");
  std::erase_if(plain.measured.tables, [](const auto& table) { return table.first.others_compute; });
  sched::HardwareProfile beside = plain;
  for (const auto& [key, points] : plain.measured.tables) {
    if (key.ranks != 2 || key.world != 4) continue;
    auto& slower = beside.measured.tables[{key.kind, 2, 4, true}];
    for (const auto& [bytes, us] : points) slower.emplace_back(bytes, us + 1000);
  }
  EXPECT_EQ(estimate::estimate_training(c, 4, 0, beside).time.step_us,
            estimate::estimate_training(c, 4, 0, plain).time.step_us);
  c.parallel.dp_shard = 1;
  c.parallel.pp = 2;
  c.parallel.pp_schedule = parallel::PpScheduleKind::gpipe;
  c.parallel.pp_microbatches = 2;
  const estimate::TrainingEstimate before = estimate::estimate_training(c, 4, 0, plain);
  const estimate::TrainingEstimate after = estimate::estimate_training(c, 4, 0, beside);
  ASSERT_TRUE(before.pipeline && after.pipeline);
  const auto stage_us = [](const estimate::PipelineEstimate& p) {
    return p.forward_us[0] + p.backward_input_us[0] + p.backward_weight_us[0];
  };
  const double per_microbatch = static_cast<double>(before.collectives) / 2;  // rank 0's one stage, 2 microbatches
  ASSERT_GT(per_microbatch, 0);
  EXPECT_NEAR(stage_us(*after.pipeline) - stage_us(*before.pipeline), 1000 * per_microbatch, 1e-6);
}

// training.fp8's GEMMs run at the profile's FP8 peak: on an H100 a large
// FP8 GEMM (compute-bound) costs the bf16 one's time x the peaks' ratio (about a half); the quantisation's
// traffic is in its bytes; a profile without an FP8 peak costs it as bf16.
TEST(Estimate, Fp8GemmAtTheFp8Peak) {
  graph::Graph g;
  graph::Builder b(g);
  const graph::ValueId x = g.add_input("x", {8192, 8192}, DType::bf16), w = g.add_input("w", {8192, 8192}, DType::bf16);
  const graph::ValueId plain = b.matmul(x, w, false, true);
  const graph::ValueId fp8 =
      b.fp8_matmul(x, w, b.amax(x, "x"), b.amax(w, "w"), false, true,
                   {graph::attr::format_a(DType::f8e4m3), graph::attr::format_b(DType::f8e4m3),
                    graph::attr::grad_format(DType::f8e5m2), graph::attr::pow2_scale(false),
                    graph::attr::tensor("layer"), graph::attr::operand_a("input"), graph::attr::operand_b("weight")});
  sched::RankDevice h100{sched::builtin_hardware("h100-sxm")};
  const double bf16_us = sched::node_us(g, g.value(plain).producer, h100);
  EXPECT_NEAR(sched::node_us(g, g.value(fp8).producer, h100), bf16_us * 989400 / 1978900, 1e-9 * bf16_us);
  h100.hardware.peak_gflops_fp8 = 0;
  EXPECT_DOUBLE_EQ(sched::node_us(g, g.value(fp8).producer, h100), bf16_us);
  const graph::Node& node = g.node(g.value(fp8).producer);
  const double elements = 8192.0 * 8192.0;  // each operand read (2 bytes), written and read in FP8; the output
  EXPECT_EQ(
      graph::op_bytes(*node.op, graph::value_infos(g, node.inputs), graph::value_infos(g, node.outputs), node.attrs),
      2 * (2 * elements + 2 * elements) + 2 * elements);
}

// An op's fixed time per call ([device.op_call_us]) adds to its FLOPs' time,
// over the rank's share of a shared host; other ops pay none.
TEST(Estimate, AnOpsCallTimeAddsToItsFlopsTime) {
  graph::Graph g;
  graph::Builder b(g);
  const graph::ValueId x = g.add_input("x", {128, 256}, DType::f32), w = g.add_input("w", {768, 256}, DType::f32);
  const graph::NodeId mm = g.value(b.matmul(x, w, false, true)).producer;
  const std::string profile =
      "name = \"calls\"\n[device]\npeak_gflops_f32 = 100\nmemory_gbps = 1000\nshared_host = true\n"
      "[device.op_efficiency]\nmatmul = 0.5\n";
  const double flops_us = 2.0 * 128 * 256 * 768 / (100e3 * 0.5 * 0.25);  // 4 ranks: a quarter of the host
  const sched::RankDevice plain{sched::parse_hardware(profile, "test"), 4};
  EXPECT_NEAR(sched::node_us(g, mm, plain), flops_us, 1e-9 * flops_us);
  const sched::RankDevice calls{sched::parse_hardware(profile + "[device.op_call_us]\nmatmul = 15\n", "test"), 4};
  EXPECT_NEAR(sched::node_us(g, mm, calls), flops_us + 15 * 4, 1e-9 * flops_us);
  const sched::RankDevice other{sched::parse_hardware(profile + "[device.op_call_us]\nattention = 15\n", "test"), 4};
  EXPECT_NEAR(sched::node_us(g, mm, other), flops_us, 1e-9 * flops_us);
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(profile + "[device.op_call_us]\nmatmul = -1\n", "t"); }),
                       "device.op_call_us.matmul must be microseconds from 0 to 1e6, got -1"));
  EXPECT_TRUE(contains(message_of([&] { sched::parse_hardware(profile + "[device.op_call_us]\nmatmull = 1\n", "t"); }),
                       "device.op_call_us.matmull names no op"));
}

// The floor of a collective's time: below the model's time for the bytes
// in one collective or split any way into several, and not far below it
// for a large one (the floor is the bandwidth term, with no latency).
TEST(CollectiveCost, TheFloorIsBelowAnySplitOfTheBytes) {
  sched::NcclLinks links = hopper_320();
  links.inter_gbps = 50;
  for (const comm::OpType kind :
       {comm::OpType::all_gather, comm::OpType::reduce_scatter, comm::OpType::all_reduce, comm::OpType::all_to_all})
    for (const auto& [ranks, hosts] : std::vector<std::pair<int, int>>{{8, 1}, {16, 2}, {64, 8}, {512, 64}})
      for (const double total : {1e3, 1e6, 1e8, 1e10}) {
        const double floor = sched::nccl_collective_floor_us(kind, total, ranks, hosts, links);
        EXPECT_GT(floor, 0);
        EXPECT_LE(floor, sched::nccl_collective_us(kind, total, ranks, hosts, links));
        for (const int pieces : {2, 7, 64}) {
          // Uneven pieces: piece i takes a share i + 1 of the whole.
          double split = 0;
          const double shares = pieces * (pieces + 1) / 2.0;
          for (int i = 0; i < pieces; ++i)
            split += sched::nccl_collective_us(kind, total * (i + 1) / shares, ranks, hosts, links);
          EXPECT_LE(floor, split) << comm::op_type_name(kind) << " " << ranks << " ranks, " << total << " bytes";
        }
        if (total >= 1e10) {
          EXPECT_GT(floor, 0.5 * sched::nccl_collective_us(kind, total, ranks, hosts, links));
        }
      }
  EXPECT_EQ(sched::nccl_collective_floor_us(comm::OpType::all_gather, 1e6, 1, 1, links), 0);
}

// An estimate builds a pipeline's stages of one shape once: another rank's
// stage that is alike is the one built, and a stage built for it anyway
// costs exactly the same (here with selective checkpointing of every other
// matmul, which the graph's order decides). 10 layers in 4 stages: the
// embedding and 2 layers, 3, 3, then 2 and the head.
TEST(TrainingEstimate, PipelineStagesOfOneShapeCostAsEachBuilt) {
  for (const char* selective : {"all", "every_other"}) {
    const config::TrainConfig c = config::load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/debug.toml",
                                                      {{"model.n_layers", "10"},
                                                       {"data.batch_size", "8"},
                                                       {"parallel.dp_shard", "2"},
                                                       {"parallel.pp", "4"},
                                                       {"parallel.pp_microbatches", "4"},
                                                       {"activation_checkpoint.mode", "selective"},
                                                       {"activation_checkpoint.selective_matmuls", selective}});
    const auto hardware = sched::builtin_hardware("h100-sxm");
    const compile::CompiledRank compiled = compile::compile_rank(c, 8, 0, hardware, {.every_stage = true});
    const compile::PipelineRank& pipeline = *compiled.pipeline;
    ASSERT_EQ(pipeline.same_as, (std::map<int, int>{{2, 1}})) << selective;
    const sched::RankDevice device{hardware, 8, nullptr};
    const auto cost = [&](const graph::ExtractedGraph& part) {
      return sched::estimate_step(part.graph, sched::make_schedule(part.graph, part.graph.outputs()), device).step_us;
    };
    const compile::PipelinePlace& place = pipeline.place;
    const compile::PipelineStage built =
        compile::build_pipeline_stage(c, place.spans, 2, place.microbatch_rows, place.where(), &device);
    const compile::PipelineStage& shared = pipeline.stage(2);
    EXPECT_EQ(&shared, &pipeline.stages.at(1));
    EXPECT_EQ(cost(built.forward), cost(shared.forward)) << selective;
    EXPECT_EQ(cost(built.backward), cost(shared.backward)) << selective;
    EXPECT_EQ(cost(built.unshard), cost(shared.unshard)) << selective;
    EXPECT_GT(cost(built.forward), 0);
  }
  // Ranks of a stage that straddle hosts unevenly (3 to a host) share nothing.
  const config::TrainConfig c = config::load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/debug.toml",
                                                    {{"model.n_layers", "10"},
                                                     {"data.batch_size", "8"},
                                                     {"parallel.dp_shard", "2"},
                                                     {"parallel.pp", "4"},
                                                     {"parallel.pp_microbatches", "4"}});
  auto odd = sched::builtin_hardware("h100-sxm");
  odd.devices_per_host = 3;
  EXPECT_TRUE(compile::compile_rank(c, 8, 0, odd, {.every_stage = true}).pipeline->same_as.empty());
}

// Every rank's estimate gives the memory of the pipeline's fullest rank at
// its place in its stage: the largest of those ranks' own peaks, and which.
// 1F1B: the first stage holds the most microbatches' activations; the last
// the head; 1F1B x 6 stages over 10 layers splits them unevenly.
TEST(TrainingEstimate, PipelinesFullestRankIsTheLargestOwnPeak) {
  for (const char* schedule : {"1f1b", "zero_bubble"}) {
    const config::TrainConfig c = config::load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/debug.toml",
                                                      {{"model.n_layers", "10"},
                                                       {"model.vocab_size", "4096"},
                                                       {"data.batch_size", "12"},
                                                       {"parallel.dp_shard", "2"},
                                                       {"parallel.pp", "6"},
                                                       {"parallel.pp_schedule", schedule},
                                                       {"parallel.pp_microbatches", "6"}});
    const auto hardware = sched::builtin_hardware("h100-sxm");
    double most = 0;
    int fullest = -1;
    std::set<double> peaks;
    for (int rank = 1; rank < 12; rank += 2) {  // every pipeline rank at stage place 1
      const double peak = estimate::estimate_training(c, 12, rank, hardware).memory.peak_bytes;
      peaks.insert(peak);
      if (peak > most) most = peak, fullest = rank;
    }
    EXPECT_GT(peaks.size(), 2u) << schedule;  // the ranks differ: the check can fail
    for (int rank = 1; rank < 12; rank += 2) {
      const estimate::TrainingEstimate e = estimate::estimate_training(c, 12, rank, hardware);
      EXPECT_EQ(e.pipeline->fullest_peak_bytes, most) << schedule << " rank " << rank;
      EXPECT_EQ(e.pipeline->fullest_rank, fullest) << schedule << " rank " << rank;
    }
  }
}
