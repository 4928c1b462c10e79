// sched/: the pass pipeline (a pass tested on the text it leaves, invariants
// checked between passes) and the static memory plan (computed without
// allocating; sound; exactly what the executor then allocates).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "compile/train_step.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "graph/ops/collective.h"
#include "runtime/executor.h"
#include "sched/estimate.h"
#include "sched/memory_estimate.h"
#include "sched/memory_plan.h"
#include "sched/pass.h"
#include "sched/passes/bucket_collectives.h"
#include "sched/passes/dead_code.h"
#include "sched/passes/prefetch_collectives.h"
#include "sched/passes/sink_waits.h"
#include "sched/schedule.h"
#include "sched/trace.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using mtest::contains;
using mtest::message_of;

TEST(DeadCode, RemovesWhatNoOutputNeeds) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {2, 4}, DType::f32);
  const ValueId w = g.add_parameter("w", {3, 4}, DType::f32);
  const ValueId loss = b.mean(b.silu(b.matmul(x, w, false, true)));
  const auto grads = append_backward(g, loss, {x, w});  // both gradients built, only dw kept
  g.add_output(loss);
  g.add_output(grads[1]);
  b.scale(b.silu(x), 2.0);  // a dead chain: the silu dies once the scale does
  const size_t before = g.num_nodes();
  EXPECT_TRUE(sched::remove_dead_nodes(g));
  EXPECT_EQ(g.num_nodes(), before - 3);
  EXPECT_EQ(to_text(g),
            "input %0:x: f32(2, 4)\n"
            "param %1:w: f32(3, 4)\n"
            "%2: f32(2, 3) = matmul(%0:x, %1:w) {transpose_a=false, transpose_b=true}  # forward\n"
            "%3: f32(2, 3) = silu(%2)  # forward\n"
            "%4: f32() = mean(%3)  # forward\n"
            "%5: f32() = full() {dtype=f32, shape=[], value=1}  # backward\n"
            "%6: f32(2, 3) = broadcast_scalar(%5) {shape=[2, 3]}  # backward\n"
            "%7: f32(2, 3) = scale(%6) {alpha=0.16666666666666666}  # backward\n"
            "%8: f32(2, 3) = silu_backward(%2, %7)  # backward\n"
            "%10: f32(3, 4) = matmul(%8, %0:x) {transpose_a=true, transpose_b=false}  # backward\n"
            "outputs %4, %10\n");
  EXPECT_FALSE(sched::remove_dead_nodes(g));  // nothing left to do
}

// A started collective of a lowered graph on mesh dims `dims`, waited on at once.
static ValueId all_reduce_now(Graph& g, ValueId x, int64_t dim) {
  const Attrs attrs{
      attr::shape({4}),        attr::mesh_dims({dim}),  attr::group({0, 1}),     attr::layout_before("P(sum)"),
      attr::layout_after("R"), attr::global_shape({4}), attr::buffer_elements(0)};
  const NodeId start = g.add_node("all_reduce", {x}, attrs);
  return g.only_output(g.add_node("wait", g.node(start).outputs));
}

// Each wait moves to just before its result's first reader, never below the
// wait of a later collective over the same mesh dims; starts stay put.
TEST(SinkWaits, WaitsMoveToTheFirstReaderInOrderPerGroup) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4}, DType::f32);
  const ValueId r1 = all_reduce_now(g, b.silu(x), 0);
  const ValueId a = b.silu(x);
  const ValueId r2 = all_reduce_now(g, a, 1);
  const ValueId c = b.silu(a);  // reads neither result
  const ValueId d = b.mul(r2, c);
  const ValueId r3 = all_reduce_now(g, c, 0);
  g.add_output(b.add(b.add(r1, r3), d));
  EXPECT_TRUE(sched::sink_waits(g));
  verify(g);
  std::vector<std::string> ops;
  for (NodeId n : g.order()) ops.push_back(g.node(n).op->name + "%" + std::to_string(g.node(n).outputs[0].index));
  EXPECT_EQ(fmt::format("{}", fmt::join(ops, " ")),
            "silu%1 all_reduce%2 silu%5 all_reduce%6 silu%9 wait%8 mul%10 all_reduce%11 wait%4 wait%13 add%14 add%15");
  EXPECT_FALSE(sched::sink_waits(g));  // already where they belong
}

// Three layers of an FSDP forward: each layer's weight shard is cast to
// bf16, all_gathered and waited on just before its matmul (as lowering
// and sink_waits leave it).
struct GatheredLayers {
  Graph g;
  std::vector<std::string> ops() const {
    std::vector<std::string> out;
    for (NodeId n : g.order()) out.push_back(g.node(n).op->name + "%" + std::to_string(g.node(n).outputs[0].index));
    return out;
  }
};
static void build_gathered_layers(GatheredLayers& l) {
  Graph& g = l.g;
  Builder b(g);
  constexpr int64_t d = 256;  // weights of 128 KiB gathered: more than the allocator rounds to
  ValueId h = g.add_input("x", {2, d}, DType::bf16);
  for (int layer = 0; layer < 3; ++layer) {
    const ValueId shard = b.cast(g.add_parameter(fmt::format("w{}", layer), {d / 2, d}, DType::f32), DType::bf16);
    const Attrs attrs{attr::shape({d, d}),      attr::mesh_dims({0}),
                      attr::group({0, 1}),      attr::layout_before("S(0)"),
                      attr::layout_after("R"),  attr::global_shape({d, d}),
                      attr::buffer_elements(0), attr::comm_bytes(static_cast<double>(d * d * 2))};
    const NodeId start = g.add_node("all_gather", {shard}, attrs);
    std::vector<ValueId> wait_inputs = g.node(start).outputs;
    wait_inputs.push_back(shard);
    h = b.matmul(h, g.only_output(g.add_node("wait", wait_inputs)), false, true);
  }
  g.add_output(h);
}

static sched::PrefetchOptions layer_costs(const Graph& g, double gather_us, double budget = 0) {
  return {.node_us =
              [&g, gather_us](NodeId n) {
                return g.node(n).op->name == "matmul" ? 10.0 : g.node(n).op->name == "all_gather" ? gather_us : 0.0;
              },
          .schedule_of = [](const Graph& graph) { return sched::make_schedule(graph, graph.outputs()); },
          .memory_budget_bytes = budget};
}

// Compute-bound (a gather takes 8 us, a matmul 10): each gather starts one
// matmul ahead of its use, its cast with it — no earlier, which would only
// hold the gathered weight longer.
TEST(PrefetchCollectives, EachGatherStartsOneMatmulAheadWhenComputeHidesIt) {
  GatheredLayers l;
  build_gathered_layers(l);
  const std::string before = fmt::format("{}", fmt::join(l.ops(), " "));
  EXPECT_EQ(before,
            "cast%2 all_gather%3 wait%5 matmul%6 cast%8 all_gather%9 wait%11 matmul%12 cast%14 all_gather%15 wait%17 "
            "matmul%18");
  EXPECT_TRUE(sched::prefetch_collectives(l.g, layer_costs(l.g, 8)));
  verify(l.g);
  EXPECT_EQ(fmt::format("{}", fmt::join(l.ops(), " ")),
            "cast%2 all_gather%3 wait%5 cast%8 all_gather%9 matmul%6 wait%11 cast%14 all_gather%15 matmul%12 wait%17 "
            "matmul%18");
  EXPECT_FALSE(sched::prefetch_collectives(l.g, layer_costs(l.g, 8)));  // nothing left to gain
}

// Communication-bound (25 us a gather): the stream is the bottleneck, so a
// gather is queued where the stream would otherwise fall idle — while the
// previous layer computes — and not sooner.
TEST(PrefetchCollectives, ABusyStreamIsKeptFedNotFlooded) {
  GatheredLayers l;
  build_gathered_layers(l);
  EXPECT_TRUE(sched::prefetch_collectives(l.g, layer_costs(l.g, 25)));
  EXPECT_EQ(fmt::format("{}", fmt::join(l.ops(), " ")),
            "cast%2 all_gather%3 wait%5 cast%8 all_gather%9 matmul%6 wait%11 cast%14 all_gather%15 matmul%12 wait%17 "
            "matmul%18");
}

// A budget no larger than what the step allocates as it is leaves the order
// alone; one with room for the prefetched weights allows it, and what the
// new order allocates stays within it.
TEST(PrefetchCollectives, NeverAboveTheMemoryBudget) {
  GatheredLayers base;
  build_gathered_layers(base);
  const auto allocated = [](const Graph& g) {
    return sched::estimate_memory(g, sched::make_schedule(g, g.outputs())).allocated_bytes;
  };
  const double tight = allocated(base.g);
  EXPECT_FALSE(sched::prefetch_collectives(base.g, layer_costs(base.g, 8, tight)));
  GatheredLayers roomy;
  build_gathered_layers(roomy);
  const double budget = tight + 192 * 1024;  // room for one more gathered weight and its cast shard
  EXPECT_TRUE(sched::prefetch_collectives(roomy.g, layer_costs(roomy.g, 8, budget)));
  EXPECT_LE(allocated(roomy.g), budget);
}

// Per block, the three gathers become one: their casts move up, one pack,
// one all_gather of every shard, waited on and unpacked before the first
// matmul; the weights come out as they did.
TEST(BucketCollectives, PerBlockMergesTheBlocksGathers) {
  GatheredLayers l;
  build_gathered_layers(l);
  EXPECT_TRUE(sched::bucket_collectives(l.g, {.mode = sched::BucketMode::per_block, .mesh_ndim = 1}));
  verify(l.g);
  EXPECT_EQ(fmt::format("{}", fmt::join(l.ops(), " ")),
            "cast%2 cast%8 cast%14 bucket_pack%19 all_gather%20 wait%22 bucket_unpack%23 matmul%6 matmul%12 matmul%18");
  const Node& gather = l.g.node(l.g.value(ValueId(20)).producer);
  EXPECT_EQ(gather.attrs.get(attr::shape), (std::vector<int64_t>{2, 3 * 128 * 256}));
  EXPECT_EQ(gather.attrs.get(attr::layout_before), "S(0)");
  EXPECT_EQ(gather.attrs.get(attr::comm_bytes), 3.0 * 256 * 256 * 2);
  // Coalesced: each member's block per rank, so each gathered weight lands whole.
  EXPECT_EQ(gather.attrs.get(attr::member_blocks), (std::vector<int64_t>{128 * 256, 128 * 256, 128 * 256}));
  EXPECT_FALSE(sched::bucket_collectives(l.g, {.mode = sched::BucketMode::per_block, .mesh_ndim = 1}));
  // Member blocks that do not add up to the rank's side are refused when the node is made.
  Attrs wrong = gather.attrs;
  wrong.set(attr::member_blocks, std::vector<int64_t>{128 * 256, 128 * 256});
  EXPECT_TRUE(contains(message_of([&] { l.g.add_node("all_gather", {gather.inputs[0]}, wrong); }),
                       "all_gather: member blocks of 65536 elements in all for 98304 elements on this rank's side"));
  // The pack and unpack leave the members' layout to the memory plan, or,
  // with member_views off, mark them to be copied.
  const Node& pack = l.g.node(l.g.value(gather.inputs[0]).producer);
  EXPECT_FALSE(pack.attrs.has("copy_members"));
  GatheredLayers copied;
  build_gathered_layers(copied);
  EXPECT_TRUE(sched::bucket_collectives(copied.g,
                                        {.mode = sched::BucketMode::per_block, .mesh_ndim = 1, .member_views = false}));
  int bucket_ops = 0;
  for (NodeId n : copied.g.order()) {
    const Node& node = copied.g.node(n);
    if (node.op->name != "bucket_pack" && node.op->name != "bucket_unpack") continue;
    ++bucket_ops;
    EXPECT_TRUE(node.attrs.get(attr::copy_members)) << node.op->name;
  }
  EXPECT_EQ(bucket_ops, 2);
}

// Partial sums all-reduced only to be outputs (a mixture of experts' per-layer
// load): no node reads them, so the bucket's wait and unpack go at the end.
// The bucket's nodes are in its members' phase, here the backward (a
// pipeline stage's programs are cut by phase).
TEST(BucketCollectives, MembersReadOnlyAsOutputsAreWaitedForAtTheEnd) {
  Graph g;
  Builder b(g);
  g.set_phase(Phase::backward);
  for (int layer = 0; layer < 2; ++layer) {
    const ValueId x = b.scale(g.add_input(fmt::format("x{}", layer), {9}, DType::f32), 2.0);
    const Attrs attrs{
        attr::shape({9}),        attr::mesh_dims({0}),    attr::group({0, 1}),      attr::layout_before("P(sum)"),
        attr::layout_after("R"), attr::global_shape({9}), attr::buffer_elements(0), attr::comm_bytes(9.0 * 4)};
    const NodeId start = g.add_node("all_reduce", {x}, attrs);
    g.add_output(g.only_output(g.add_node("wait", g.node(start).outputs)));
  }
  g.set_phase(Phase::forward);
  EXPECT_TRUE(sched::bucket_collectives(g, {.mode = sched::BucketMode::per_block, .mesh_ndim = 1}));
  verify(g);
  EXPECT_EQ(g.phase(), Phase::forward);
  std::vector<std::string> ops;
  for (NodeId n : g.order()) {
    ops.push_back(g.node(n).op->name);
    EXPECT_EQ(g.node(n).phase, Phase::backward) << ops.back();
  }
  EXPECT_EQ(fmt::format("{}", fmt::join(ops, " ")), "scale scale bucket_pack all_reduce wait bucket_unpack");
  for (ValueId out : g.outputs()) EXPECT_EQ(g.node(g.value(out).producer).op->name, "bucket_unpack");
}

// A weight's gather and an activation's over one group (context
// parallelism's keys and its FSDP over cp) stay apart: a bucket with the
// activation would gather the weight again for every microbatch and keep it
// for the backward.
TEST(BucketCollectives, WeightsAndActivationsShareNoBucket) {
  Graph g;
  Builder b(g);
  const ValueId weight = b.cast(g.add_parameter("w", {4, 8}, DType::f32), DType::bf16);
  const ValueId keys = b.scale(g.add_input("k", {4, 8}, DType::bf16), 2.0);
  for (const ValueId shard : {weight, keys}) {
    const Attrs attrs{attr::shape({8, 8}),         attr::mesh_dims({0}),         attr::group({0, 1}),
                      attr::layout_before("S(0)"), attr::layout_after("R"),      attr::global_shape({8, 8}),
                      attr::buffer_elements(0),    attr::comm_bytes(8.0 * 8 * 2)};
    const NodeId start = g.add_node("all_gather", {shard}, attrs);
    g.add_output(b.scale(g.only_output(g.add_node("wait", g.node(start).outputs)), 1.0));
  }
  EXPECT_FALSE(sched::bucket_collectives(g, {.mode = sched::BucketMode::per_block, .mesh_ndim = 1}));
  EXPECT_FALSE(sched::bucket_collectives(g, {.mode = sched::BucketMode::size_cap, .mesh_ndim = 1}));
}

// Under a cap of two gathers' bytes, the first two share a bucket and the
// third, alone, stays as it was.
TEST(BucketCollectives, SizeCapClosesABucketAtTheCap) {
  GatheredLayers l;
  build_gathered_layers(l);
  EXPECT_TRUE(sched::bucket_collectives(
      l.g, {.mode = sched::BucketMode::size_cap, .cap_bytes = 2.0 * 256 * 256 * 2, .mesh_ndim = 1}));
  verify(l.g);
  EXPECT_EQ(fmt::format("{}", fmt::join(l.ops(), " ")),
            "cast%2 cast%8 bucket_pack%19 all_gather%20 wait%22 bucket_unpack%23 matmul%6 matmul%12 cast%14 "
            "all_gather%15 wait%17 matmul%18");
}

// bucket_pack lays the members one after another; bucket_unpack takes them
// back, by value.
TEST(BucketCollectives, PackAndUnpackLayMembersOneAfterAnother) {
  Graph g;
  const ValueId a = g.add_input("a", {4}, DType::f32), b = g.add_input("b", {2, 3}, DType::f32);
  const ValueId packed = g.only_output(g.add_node("bucket_pack", {a, b}));
  EXPECT_EQ(g.value(packed).info.shape, Shape({1, 10}));
  const NodeId unpack =
      g.add_node("bucket_unpack", {packed},
                 {attr::member_shapes(graph::ops::bucket_member_shapes_attr({Shape({4}), Shape({2, 3})}))});
  g.add_output(packed);
  for (ValueId v : g.node(unpack).outputs) g.add_output(v);
  runtime::Executor ex(g, sched::make_schedule(g, g.outputs()), nullptr);
  const auto filled = [](const Shape& shape, float first) {
    Tensor t = Tensor::empty(shape, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[static_cast<size_t>(i)] = first + static_cast<float>(i);
    return t;
  };
  const auto values = [](const Tensor& t) {
    std::vector<double> out;
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.get(i));
    return out;
  };
  ex.bind(a, filled({4}, 0));
  ex.bind(b, filled({2, 3}, 10));
  ex.run();
  EXPECT_EQ(values(ex.fetch(packed)), (std::vector<double>{0, 1, 2, 3, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(values(ex.fetch(g.node(unpack).outputs[0])), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(values(ex.fetch(g.node(unpack).outputs[1])), (std::vector<double>{10, 11, 12, 13, 14, 15}));
}

// A bucket's members are views of the bucket: a member the
// step computes is written in place in the bucket (bucket_pack copies only
// the others, here an input), and bucket_unpack's members are the bucket's
// byte ranges. Values as copies would give them; the arena holds the bucket
// alone, live from the first member computed; the memory estimate agrees with the plan.
TEST(MemoryPlan, BucketMembersAreViewsOfTheBucket) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4}, DType::f32), y = g.add_input("y", {2, 3}, DType::f32),
                z = g.add_input("z", {2}, DType::f32);
  const ValueId sx = b.silu(x), sy = b.silu(y);
  const ValueId packed = g.only_output(g.add_node("bucket_pack", {sx, z, sy}));
  const NodeId unpack =
      g.add_node("bucket_unpack", {packed},
                 {attr::member_shapes(graph::ops::bucket_member_shapes_attr({Shape({4}), Shape({2}), Shape({2, 3})}))});
  for (ValueId v : g.node(unpack).outputs) g.add_output(v);
  const graph::Schedule schedule = sched::make_schedule(g, g.outputs());
  const graph::MemoryPlan& plan = schedule.memory;
  EXPECT_EQ(plan.storage_of(sx), packed);
  EXPECT_EQ(plan.offset_in_storage(sx), 0u);
  EXPECT_EQ(plan.storage_of(z), z);  // an input: copied in
  EXPECT_EQ(plan.storage_of(sy), packed);
  EXPECT_EQ(plan.offset_in_storage(sy), 24u);
  const std::vector<ValueId>& members = g.node(unpack).outputs;
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(plan.storage_of(members[i]), packed) << i;
    EXPECT_EQ(plan.offset_in_storage(members[i]), (std::vector<size_t>{0, 16, 24})[i]) << i;
  }
  EXPECT_EQ(plan.peak_bytes, sched::kArenaAlignment);  // 48 bytes: the bucket, nothing else
  const sched::MemoryEstimate memory = sched::estimate_memory(g, schedule);
  EXPECT_EQ(memory.arena_bytes, static_cast<double>(plan.peak_bytes));
  EXPECT_EQ(*std::max_element(memory.live_bytes.begin(), memory.live_bytes.end()), memory.input_bytes + 48);
  EXPECT_EQ(memory.live_bytes[0], memory.input_bytes + 48);  // the bucket's range taken by the first member
  EXPECT_EQ(sched::bucket_copy_share(g, plan, g.node(g.value(packed).producer)), 8.0 / 48);  // z alone
  EXPECT_EQ(sched::bucket_copy_share(g, plan, g.node(unpack)), 0.0);
  const sched::RankDevice device{.hardware = {.name = "test", .peak_gflops_f32 = 100, .memory_gbps = 10},
                                 .world_size = 1};
  const NodeId pack = g.value(packed).producer;
  EXPECT_DOUBLE_EQ(sched::planned_node_us(g, pack, device, plan), sched::node_us(g, pack, device) * 8 / 48);
  EXPECT_EQ(sched::planned_node_us(g, unpack, device, plan), 0.0);
  EXPECT_GT(sched::node_us(g, unpack, device), 0.0);

  runtime::Executor ex(g, schedule, nullptr);
  Tensor xs = Tensor::empty({4}, DType::f32), ys = Tensor::empty({2, 3}, DType::f32),
         zs = Tensor::empty({2}, DType::f32);
  for (int i = 0; i < 4; ++i) xs.data<float>()[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 1;
  for (int i = 0; i < 6; ++i) ys.data<float>()[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i);
  zs.data<float>()[0] = 7;
  zs.data<float>()[1] = -3;
  ex.bind(x, xs);
  ex.bind(y, ys);
  ex.bind(z, zs);
  ex.run();
  const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ex.fetch(members[0]).get(i), silu(xs.get(i)), 1e-6) << i;
  EXPECT_EQ(ex.fetch(members[1]).get(0), 7);
  EXPECT_EQ(ex.fetch(members[1]).get(1), -3);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(ex.fetch(members[2]).get(i), silu(ys.get(i)), 1e-6) << i;
}

// With attr::copy_members (schedule.bucket_views = false), the same bucket's
// members keep their own storage: the pack copies every member in, the
// unpack every member out, and the values are the same.
TEST(MemoryPlan, BucketMembersMarkedForCopiesAreNotViews) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4}, DType::f32), y = g.add_input("y", {2, 3}, DType::f32);
  const ValueId sx = b.silu(x), sy = b.silu(y);
  const Attrs copy = Attrs().set(attr::copy_members, true);
  const ValueId packed = g.only_output(g.add_node("bucket_pack", {sx, sy}, copy));
  const NodeId unpack = g.add_node(
      "bucket_unpack", {packed},
      Attrs(copy).set(attr::member_shapes, graph::ops::bucket_member_shapes_attr({Shape({4}), Shape({2, 3})})));
  for (ValueId v : g.node(unpack).outputs) g.add_output(v);
  const graph::Schedule schedule = sched::make_schedule(g, g.outputs());
  const graph::MemoryPlan& plan = schedule.memory;
  for (const ValueId v : {sx, sy, g.node(unpack).outputs[0], g.node(unpack).outputs[1]}) {
    EXPECT_EQ(plan.storage_of(v), v) << g.describe_value(v);
    EXPECT_EQ(plan.view_offset.count(v), 0u) << g.describe_value(v);
  }
  EXPECT_EQ(sched::bucket_copy_share(g, plan, g.node(g.value(packed).producer)), 1.0);
  EXPECT_EQ(sched::bucket_copy_share(g, plan, g.node(unpack)), 1.0);
  EXPECT_GT(plan.peak_bytes, sched::kArenaAlignment);  // the bucket and members apart
  EXPECT_EQ(sched::estimate_memory(g, schedule).arena_bytes, static_cast<double>(plan.peak_bytes));

  runtime::Executor ex(g, schedule, nullptr);
  Tensor xs = Tensor::empty({4}, DType::f32), ys = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 4; ++i) xs.data<float>()[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 1;
  for (int i = 0; i < 6; ++i) ys.data<float>()[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i);
  ex.bind(x, xs);
  ex.bind(y, ys);
  ex.run();
  const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ex.fetch(g.node(unpack).outputs[0]).get(i), silu(xs.get(i)), 1e-6) << i;
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(ex.fetch(g.node(unpack).outputs[1]).get(i), silu(ys.get(i)), 1e-6) << i;
}

// An all_reduce takes its input's bytes where it is the input's last reader,
// and gets its own where the input is read after it.
TEST(MemoryPlan, AllReduceRunsInPlaceWhereItsInputDies) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4}, DType::f32);
  const ValueId dying = b.silu(x), kept = b.silu(x);
  const ValueId r1 = all_reduce_now(g, dying, 0);
  const ValueId r2 = all_reduce_now(g, kept, 0);
  g.add_output(b.add(b.add(r1, r2), kept));
  const graph::MemoryPlan plan = sched::make_schedule(g, g.outputs()).memory;
  const auto start_of = [&](ValueId waited) { return g.node(g.value(waited).producer).inputs[0]; };
  EXPECT_EQ(plan.offsets.at(plan.storage_of(r1)), plan.offsets.at(dying));
  EXPECT_NE(plan.offsets.at(plan.storage_of(r2)), plan.offsets.at(kept));
  EXPECT_EQ(plan.storage_of(r1), start_of(r1));  // the wait's output is a view of the started result
}

// AdamW writes the parameter and its moments where they lie when the run
// updates them and nothing reads the old values after it; where something
// does, the update goes to the arena and is copied back after the run. Both
// leave the same numbers in the bound tensors.
TEST(MemoryPlan, AdamwUpdatesItsStateInPlaceWhereNothingReadsItAfter) {
  for (const bool read_after : {false, true}) {
    SCOPED_TRACE(read_after ? "the old parameter read after the update" : "nothing read after");
    Graph g;
    Builder b(g);
    const ValueId p = g.add_parameter("p", {5}, DType::f32);
    const ValueId grad = g.add_input("grad", {5}, DType::f32);
    const ValueId m = g.add_input("m", {5}, DType::f32), v = g.add_input("v", {5}, DType::f32);
    const ValueId lr = g.add_input("lr", {}, DType::f64), step = g.add_input("step", {}, DType::i64);
    const auto updated = b.adamw(p, grad, m, v, lr, step, 0.9, 0.95, 1e-8, 0.1);
    for (ValueId u : updated) g.add_output(u);
    if (read_after) g.add_output(b.add(p, updated[0]));
    const std::vector<Update> updates{{updated[0], p}, {updated[1], m}, {updated[2], v}};
    const Schedule schedule = sched::make_schedule(g, g.outputs(), updates);
    EXPECT_EQ(schedule.memory.storage_of(updated[0]) == p, !read_after);
    EXPECT_EQ(schedule.memory.storage_of(updated[1]), m);
    EXPECT_EQ(schedule.memory.storage_of(updated[2]), v);
    EXPECT_EQ(schedule.memory.offsets.count(updated[1]), 0u);  // no arena bytes for an update made in place
    // The expected numbers: the same update computed into fresh outputs.
    auto bind_all = [&](runtime::Executor& ex, std::vector<Tensor>& state) {
      const std::vector<std::vector<float>> values{
          {1, -2, 3, -4, 5}, {0.5f, 0.1f, -1, 2, 0}, {0.1f, 0, 0.2f, 0, 0.3f}, {1, 2, 3, 4, 5}};
      const std::vector<ValueId> inputs{p, grad, m, v};
      state.clear();
      for (size_t i = 0; i < inputs.size(); ++i) {
        Tensor& t = state.emplace_back(Tensor::empty({5}, DType::f32));
        std::copy(values[i].begin(), values[i].end(), t.data<float>().begin());
        ex.bind(inputs[i], t);
      }
      Tensor lr_t = Tensor::empty({}, DType::f64), step_t = Tensor::empty({}, DType::i64);
      lr_t.set(0, 0.01);
      step_t.data<int64_t>()[0] = 3;
      ex.bind(lr, lr_t);
      ex.bind(step, step_t);
    };
    runtime::Executor reference(g, sched::make_schedule(g, g.outputs()));
    std::vector<Tensor> fresh, in_place;
    bind_all(reference, fresh);
    reference.run();
    runtime::Executor ex(g, schedule);
    bind_all(ex, in_place);
    ex.run();
    for (int k = 0; k < 3; ++k) {
      const Tensor want = reference.fetch(updated[static_cast<size_t>(k)]);
      const Tensor& got = in_place[static_cast<size_t>(k == 0 ? 0 : k + 1)];
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(got.get(i), want.get(i)) << "output " << k << " element " << i;
      EXPECT_NE(want.get(0), fresh[static_cast<size_t>(k == 0 ? 0 : k + 1)].get(0));  // it did change
    }
  }
}

// The trace of a step: every node that ran on the compute track at its
// time, and each collective on the communication track from its start to
// the end of its wait; the ranks' events merge into one document.
TEST(Trace, ComputeAndCommunicationTracksFromTheSpans) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4}, DType::f32);
  const ValueId y = b.silu(x);
  const ValueId r = all_reduce_now(g, y, 0);
  g.add_output(b.add(r, y));
  std::vector<NodeSpan> spans;
  double t = 0;
  for (NodeId n : g.order()) {  // silu 0-10, all_reduce 10-20, wait 20-30, add 30-40
    spans.push_back({n, t, t + 10});
    t += 10;
  }
  const nlohmann::json rank1 = nlohmann::json::parse(sched::chrome_trace_events(g, spans, 1));
  std::vector<std::string> compute;
  for (const auto& e : rank1)
    if (e["ph"] == "X") {
      EXPECT_EQ(e["pid"], 1);
      compute.push_back(
          fmt::format("{}@{}+{}", e["name"].get<std::string>(), e["ts"].get<double>(), e["dur"].get<double>()));
    }
  EXPECT_EQ(compute, (std::vector<std::string>{"silu@0+10", "all_reduce@10+10", "wait@20+10", "add@30+10"}));
  std::vector<std::string> communication;
  for (const auto& e : rank1)
    if (e["ph"] == "b" || e["ph"] == "e")
      communication.push_back(
          fmt::format("{}{}@{}", e["ph"].get<std::string>(), e["name"].get<std::string>(), e["ts"].get<double>()));
  EXPECT_EQ(communication,
            (std::vector<std::string>{"ball_reduce@10", "eall_reduce@30"}));  // in flight until its wait ended
  const nlohmann::json doc = nlohmann::json::parse(
      sched::chrome_trace({sched::chrome_trace_events(g, spans, 0), sched::chrome_trace_events(g, spans, 1)}));
  EXPECT_EQ(doc["traceEvents"].size(), 2 * rank1.size());
  EXPECT_TRUE(contains(message_of([&] {
                         sched::chrome_trace_events(g, {{NodeId(99), 0, 1}}, 0);
                       }),
                       "node 99 is not in the graph"));
}

// An executor tracing its run records every step that ran, views left out,
// in order and inside the run.
TEST(Trace, ExecutorRecordsEveryStepThatRan) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {2, 3}, DType::f32);
  const ValueId y = b.reshape(b.silu(x), {3, 2});
  g.add_output(b.scale(y, 2.0));
  runtime::Executor ex(g, sched::make_schedule(g, g.outputs()));
  ex.bind(x, Tensor::zeros({2, 3}, DType::f32));
  ex.run();
  EXPECT_TRUE(ex.trace().empty());  // only while tracing is on
  ex.set_tracing(true);
  ex.run();
  std::vector<std::string> ops;
  double last_end = 0;
  for (const NodeSpan& s : ex.trace()) {
    ops.push_back(g.node(s.node).op->name);
    EXPECT_LE(last_end, s.begin_us);
    EXPECT_LE(s.begin_us, s.end_us);
    last_end = s.end_us;
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"silu", "scale"}));
}

namespace {

// silu(x) all_reduced over ranks 0 and 1 (16 KiB) while a matmul of x runs,
// then the two added: the step the estimate tests below cost by hand.
struct ReduceBesideMatmul {
  Graph g;
  ValueId y, z;  // the silu, the matmul
  NodeId start, wait;
};

void build_reduce_beside_matmul(ReduceBesideMatmul& s) {
  Graph& g = s.g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 64}, DType::f32);
  s.y = b.silu(x);
  const Attrs attrs{attr::shape({64, 64}),         attr::mesh_dims({0}),           attr::group({0, 1}),
                    attr::layout_before("P(sum)"), attr::layout_after("R"),        attr::global_shape({64, 64}),
                    attr::buffer_elements(0),      attr::comm_bytes(64.0 * 64 * 4)};
  s.start = g.add_node("all_reduce", {s.y}, attrs);
  s.z = b.matmul(x, x, false, false);
  s.wait = g.add_node("wait", g.node(s.start).outputs);
  g.add_output(b.add(g.only_output(s.wait), s.z));
}

}  // namespace

// The estimate of a step: a matmul's roofline by hand, and a collective in
// flight on its group's stream while the compute stream runs on, its wait
// holding the compute stream for what the matmul did not hide.
TEST(Estimate, CollectiveOverlapsTheComputeBeforeItsWait) {
  ReduceBesideMatmul step;
  build_reduce_beside_matmul(step);
  const Graph& g = step.g;
  const ValueId y = step.y, z = step.z;
  const NodeId start = step.start, wait = step.wait;
  sched::RankDevice device{.hardware = {.name = "test",
                                        .peak_gflops_f32 = 100,
                                        .memory_gbps = 10,
                                        .compute_efficiency = 1,
                                        .memory_efficiency = 1},
                           .world_size = 2};
  device.hardware.collectives = sched::HardwareProfile::CollectiveModel::measured;
  device.hardware.measured.tables[{comm::OpType::all_reduce, 2}] = {{0.0, 4.0}, {1 << 20, 4.0 + 1024}};
  const NodeId matmul = g.value(z).producer;
  // 2 * 64^3 FLOPs at 100 GFLOP/s (5.24 us) outlast 3 * 16 KiB at 10 GB/s (4.92 us).
  EXPECT_NEAR(sched::node_us(g, matmul, device), 2.0 * 64 * 64 * 64 / 100e3, 1e-9);
  // all_reduce of 16 KiB over 2 ranks, on the measured line from 4 us at 0 B to 1028 us at 1 MiB.
  const double reduce_us = 4 + 16;
  EXPECT_NEAR(sched::node_us(g, start, device), reduce_us, 1e-9);
  const sched::StepEstimate e = sched::estimate_step(g, sched::make_schedule(g, g.outputs()), device);
  const double silu_us = sched::node_us(g, g.value(y).producer, device);
  const double add_us = sched::node_us(g, g.value(g.outputs()[0]).producer, device);
  const double matmul_us = sched::node_us(g, matmul, device);
  EXPECT_NEAR(e.exposed_us, reduce_us - matmul_us, 1e-9);
  EXPECT_NEAR(e.step_us, silu_us + reduce_us + add_us, 1e-9);
  EXPECT_NEAR(e.compute_us, silu_us + matmul_us + add_us, 1e-9);
  EXPECT_NEAR(e.communication_us, reduce_us, 1e-9);
  ASSERT_EQ(e.timeline.size(), 5u);
  EXPECT_EQ(e.timeline[3].node, wait);
  EXPECT_NEAR(e.timeline[3].end_us, silu_us + reduce_us, 1e-9);
  // The estimated timeline draws like a measured one.
  const nlohmann::json events = nlohmann::json::parse(sched::chrome_trace_events(g, e.timeline, 0));
  EXPECT_EQ(std::count_if(events.begin(), events.end(), [](const auto& ev) { return ev["ph"] == "b"; }), 1);
  device.hardware.measured.tables.clear();
  device.hardware.measured.tables[{comm::OpType::all_reduce, 4}] = {{0.0, 1.0}};
  EXPECT_TRUE(contains(message_of([&] { sched::estimate_step(g, sched::make_schedule(g, g.outputs()), device); }),
                       "no all_reduce over 2 ranks (measured over: 4)"));
}

// A collective that packs its blocks into a staging buffer (an all_to_all
// between sharded dims: the blocks packed before it goes out and unpacked
// once they arrive) pays those copies, each element read and written once,
// at memory bandwidth, on top of its measured time.
TEST(Estimate, ACollectivePaysTheCopiesThroughItsStagingBuffer) {
  sched::RankDevice device{.hardware = {.name = "test",
                                        .peak_gflops_f32 = 100,
                                        .memory_gbps = 10,
                                        .compute_efficiency = 1,
                                        .memory_efficiency = 0.5},
                           .world_size = 2};
  device.hardware.collectives = sched::HardwareProfile::CollectiveModel::measured;
  device.hardware.measured.tables[{comm::OpType::all_to_all, 2}] = {{0.0, 4.0}, {1 << 20, 4.0 + 1024}};
  auto all_to_all_us = [&](int64_t buffer_elements) {
    Graph g;
    const ValueId x = g.add_input("x", {64, 64}, DType::f32);
    const NodeId start =
        g.add_node("all_to_all", {x},
                   Attrs{attr::shape({128, 32}), attr::mesh_dims({0}), attr::group({0, 1}), attr::layout_before("S(0)"),
                         attr::layout_after("S(1)"), attr::global_shape({128, 64}),
                         attr::buffer_elements(buffer_elements), attr::comm_bytes(64.0 * 64 * 4)});
    g.add_output(g.only_output(g.add_node("wait", g.node(start).outputs)));
    return sched::node_us(g, start, device);
  };
  const double table_us = 4 + 16;  // 16 KiB on the measured line
  // 2 x 4096 f32 elements through the buffer, each read and written: 64 KiB at 10 GB/s x 0.5.
  EXPECT_NEAR(all_to_all_us(2 * 64 * 64), table_us + 2.0 * 2 * 64 * 64 * 4 / (10 * 0.5) * 1e-3, 1e-9);
  // Blocks sent in place, without a buffer: the measured time alone.
  EXPECT_NEAR(all_to_all_us(0), table_us, 1e-9);
}

// On a shared host a collective runs on the compute stream (the cores that
// compute copy its bytes) and first waits for its group's slowest rank: in
// benchmark mode, the measured share of what the rank computed since it last
// waited (here half of the silu before it), else the profile's.
TEST(Estimate, OnASharedHostACollectiveWaitsForItsSlowestRank) {
  ReduceBesideMatmul step;
  build_reduce_beside_matmul(step);
  const Graph& g = step.g;
  const ValueId y = step.y, z = step.z;
  const NodeId start = step.start;
  sched::KernelTimes times;  // no kernel measured: each costs its roofline
  sched::RankDevice device{.hardware = {.name = "test",
                                        .peak_gflops_f32 = 100,
                                        .memory_gbps = 10,
                                        .compute_efficiency = 1,
                                        .memory_efficiency = 1,
                                        .shared_host = true},
                           .world_size = 2,
                           .measured = &times};
  device.hardware.collectives = sched::HardwareProfile::CollectiveModel::measured;
  device.hardware.measured.tables[{comm::OpType::all_reduce, 2}] = {{0.0, 4.0}, {1 << 20, 4.0 + 1024}};
  const double silu_us = sched::node_us(g, g.value(y).producer, device);
  const double matmul_us = sched::node_us(g, g.value(z).producer, device);
  const double add_us = sched::node_us(g, g.value(g.outputs()[0]).producer, device);
  const double reduce_us = 4 + 16;
  const graph::Schedule schedule = sched::make_schedule(g, g.outputs());
  const sched::StepEstimate even = sched::estimate_step(g, schedule, device);
  EXPECT_NEAR(even.step_us, silu_us + reduce_us + matmul_us + add_us, 1e-9);  // nothing hides the collective
  EXPECT_NEAR(even.exposed_us, reduce_us, 1e-9);
  // The profile's lateness (bench/calibrate.sh's), where benchmark mode measured none.
  device.hardware.sync_lateness.tables[{2, 2}] = {{.interval_us = 1000, .share = 0.25}};
  EXPECT_NEAR(sched::estimate_step(g, schedule, device).step_us,
              silu_us + 0.25 * silu_us + reduce_us + matmul_us + add_us, 1e-9);
  // What benchmark mode measured, over the profile's.
  times.sync_lateness.tables[{2, 2}] = {{.interval_us = 1000, .share = 0.5}};
  const sched::StepEstimate uneven = sched::estimate_step(g, schedule, device);
  EXPECT_NEAR(uneven.step_us, silu_us + 0.5 * silu_us + reduce_us + matmul_us + add_us, 1e-9);
  EXPECT_NEAR(uneven.exposed_us, reduce_us, 1e-9);
  EXPECT_NEAR(uneven.waiting_us, 0.5 * silu_us, 1e-9);
  EXPECT_EQ(even.waiting_us, 0);
  EXPECT_NEAR(uneven.timeline[1].end_us - uneven.timeline[1].begin_us, 0.5 * silu_us + reduce_us, 1e-9);
  EXPECT_EQ(uneven.timeline[1].node, start);
  // The 2 ranks on 2 cores: each has its core, waiting frees nothing. On 1
  // core: while the rest of the group waits, the slowest rank has the core to
  // itself and catches up twice as fast (the lateness was measured with both
  // computing).
  device.hardware.host_cores = 2;
  EXPECT_NEAR(sched::estimate_step(g, schedule, device).waiting_us, 0.5 * silu_us, 1e-9);
  device.hardware.host_cores = 1;
  const sched::StepEstimate alone = sched::estimate_step(g, schedule, device);
  EXPECT_NEAR(alone.waiting_us, 0.25 * silu_us, 1e-9);
  EXPECT_NEAR(alone.step_us, silu_us + 0.25 * silu_us + reduce_us + matmul_us + add_us, 1e-9);
}

TEST(PassPipeline, VerifiesAfterEachChangingPass) {
  Graph g;
  Builder b(g);
  g.add_output(b.silu(b.silu(g.add_input("x", {4}, DType::f32))));
  sched::PassPipeline p("test");
  p.add({"noop", [](Graph&) { return false; }});
  p.add({"reverse_order", [](Graph& graph) {
           std::vector<NodeId> order = graph.order();
           std::reverse(order.begin(), order.end());
           graph.set_order(order);
           return true;
         }});
  p.set_verify(true);
  try {
    p.run(g);
    ADD_FAILURE() << "expected the pipeline to fail after reverse_order";
  } catch (const InternalError& e) {  // the pass's bug, not the graph's: no meshtrain::Error
    EXPECT_TRUE(contains(e.what(), "pipeline test: after pass reverse_order: verify: node")) << e.what();
  }
  // The graph that pass left broken, given again: the caller's graph is at fault.
  EXPECT_THROW(p.run(g), InvalidArgument);
  EXPECT_TRUE(contains(message_of([&] { p.run(g); }), "pipeline test: the graph given is invalid: verify: node"));
  EXPECT_EQ(p.pass_names(), (std::vector<std::string>{"noop", "reverse_order"}));
  EXPECT_EQ(sched::step_pipeline().pass_names(), (std::vector<std::string>{"remove_dead_nodes"}));
  EXPECT_EQ(sched::lowered_step_pipeline().pass_names(), (std::vector<std::string>{"sink_waits"}));
}

namespace {

size_t nbytes(const Graph& g, ValueId v) {
  return static_cast<size_t>(g.value(v).info.shape.numel()) * dtype_size(g.value(v).info.dtype);
}

// A small training step (forward, backward, clipping, AdamW) as the trainer builds it.
struct StepGraph {
  Graph g;
  compile::TrainStepGraph s;
  StepGraph() {
    models::LlamaConfig c;
    c.dim = 32;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 48;
    c.vocab_size = 29;
    s = compile::build_train_step(g, c, 2, 8, {}, {.max_grad_norm = 1.0});
    sched::step_pipeline().run(g);
  }
};

}  // namespace

// Checked independently of the planner: a value occupies its range from the
// step that computes it to the last step that reads it (to the end if
// fetched); no two values whose lifetimes overlap share a byte, and every
// range fits in the peak.
TEST(MemoryPlan, NoTwoLiveValuesOverlap) {
  StepGraph t;
  const Schedule schedule = sched::make_schedule(t.g, t.g.outputs());
  const MemoryPlan& plan = schedule.memory;
  struct Life {
    size_t begin, end, offset, bytes;
  };
  std::map<ValueId, Life> life;
  for (size_t step = 0; step < schedule.steps.size(); ++step) {
    const Node& node = t.g.node(schedule.steps[step]);
    for (ValueId out : node.outputs)
      if (plan.offsets.count(out)) life[out] = {step, step, plan.offsets.at(out), nbytes(t.g, out)};
    for (ValueId in : node.inputs)
      if (auto it = life.find(plan.storage_of(in)); it != life.end()) it->second.end = step;
  }
  for (ValueId v : schedule.fetches) life.at(plan.storage_of(v)).end = schedule.steps.size();
  ASSERT_GT(life.size(), 100u);
  size_t max_live = 0;
  for (size_t step = 0; step < schedule.steps.size(); ++step) {
    size_t live = 0;
    for (const auto& [v, l] : life) live += l.begin <= step && step <= l.end ? l.bytes : 0;
    max_live = std::max(max_live, live);
  }
  for (auto a = life.begin(); a != life.end(); ++a) {
    EXPECT_LE(a->second.offset + a->second.bytes, plan.peak_bytes);
    EXPECT_EQ(a->second.offset % sched::kArenaAlignment, 0u);
    for (auto b = std::next(a); b != life.end(); ++b) {
      const bool same_time = a->second.begin <= b->second.end && b->second.begin <= a->second.end;
      const bool same_bytes = a->second.offset < b->second.offset + b->second.bytes &&
                              b->second.offset < a->second.offset + a->second.bytes;
      EXPECT_FALSE(same_time && same_bytes) << t.g.describe_value(a->first) << " and " << t.g.describe_value(b->first);
    }
  }
  EXPECT_GE(plan.peak_bytes, max_live);
}

TEST(MemoryPlan, ComputedWithoutAllocatingAndEqualToTheExecutorsArena) {
  StepGraph t;
  const auto before_plan = default_allocator().stats();
  const Schedule schedule = sched::make_schedule(t.g, t.g.outputs());
  EXPECT_EQ(default_allocator().stats().allocations, before_plan.allocations);  // no tensor memory for a plan
  ASSERT_GT(schedule.memory.peak_bytes, 0u);
  default_allocator().release_cache();  // so the arena is a fresh block, not a cached one
  const auto before = default_allocator().stats();
  runtime::Executor ex(t.g, schedule);
  const auto after = default_allocator().stats();
  EXPECT_EQ(ex.arena_bytes(), schedule.memory.peak_bytes);
  EXPECT_EQ(after.allocations, before.allocations + 1);  // the arena, once
  EXPECT_EQ(after.current_bytes - before.current_bytes, CachingAllocator::block_size(schedule.memory.peak_bytes));
}

TEST(MemoryPlan, ExecutorRejectsAScheduleThatDoesNotPlaceAValue) {
  Graph g;
  Builder b(g);
  const ValueId y = b.silu(g.add_input("x", {4}, DType::f32));
  Schedule schedule = sched::make_schedule(g, {y});
  schedule.memory.offsets.clear();
  EXPECT_TRUE(contains(message_of([&] { runtime::Executor ex(g, schedule); }),
                       "silu.0: f32(4) has no place in the memory plan"));
}

// What backward reads of a block's forward after checkpointing: under full,
// only what the block keeps (its output, read by the next forward node
// outside it, and values computed from parameters alone); under selective,
// also its matmuls' and attention's outputs. Everything else backward needs
// is recomputed in backward, by the same ops, before its first reader.
TEST(CheckpointActivations, BackwardReadsOnlyWhatTheBlockKeeps) {
  using Mode = sched::ActivationCheckpoint;
  using Matmuls = sched::SelectiveMatmuls;
  for (const auto& [mode, matmuls] : {std::pair{Mode::full, Matmuls::all}, std::pair{Mode::selective, Matmuls::all},
                                      std::pair{Mode::selective, Matmuls::every_other}}) {
    SCOPED_TRACE(
        fmt::format("{}, {} matmuls", sched::activation_checkpoint_name(mode), sched::selective_matmuls_name(matmuls)));
    StepGraph t;
    const size_t before = t.g.num_nodes();
    std::map<NodeId, int> matmul_index;  // a forward matmul's place among its block's, from 0
    std::map<std::string, int> matmuls_seen;
    for (NodeId n : t.g.order()) {
      const Node& node = t.g.node(n);
      if (node.phase == Phase::forward && node.op->name == "matmul" && node.scope.rfind("layers.", 0) == 0)
        matmul_index[n] = matmuls_seen[node.scope.substr(0, node.scope.find('.', 7))]++;
    }
    size_t recomputed_backward = 0;
    const auto in_block = [](const Node& n) { return n.phase == Phase::forward && n.scope.rfind("layers.", 0) == 0; };
    std::map<ValueId, int> forward_block_reads;  // block values read by backward before the pass
    for (NodeId n : t.g.order())
      for (ValueId in : t.g.node(n).inputs)
        if (t.g.node(n).phase == Phase::backward && t.g.value(in).producer.valid() &&
            in_block(t.g.node(t.g.value(in).producer)))
          ++forward_block_reads[in];
    EXPECT_TRUE(sched::checkpoint_activations(t.g, mode, matmuls));
    verify(t.g);
    EXPECT_FALSE(sched::checkpoint_activations(t.g, sched::ActivationCheckpoint::none));
    for (NodeId n : t.g.order()) {
      const Node& node = t.g.node(n);
      if (node.phase == Phase::backward && node.scope.rfind("layers.", 0) == 0 &&
          (node.op->name == "rms_norm" || node.op->name == "swiglu" || node.op->name == "rope"))
        ++recomputed_backward;  // forward ops, now run in backward
      if (node.phase != Phase::backward) continue;
      for (ValueId in : node.inputs) {
        const NodeId p = t.g.value(in).producer;
        if (!p.valid() || !in_block(t.g.node(p))) continue;
        const Node& producer = t.g.node(p);
        bool read_outside = false;  // by a forward node of another block or outside the blocks
        for (NodeId u : t.g.users(in))
          read_outside |=
              t.g.node(u).phase == Phase::forward && t.g.node(u).scope.substr(0, 8) != producer.scope.substr(0, 8);
        const bool from_parameter = std::all_of(producer.inputs.begin(), producer.inputs.end(),
                                                [&](ValueId x) { return t.g.value(x).kind == ValueKind::parameter; });
        const bool kept_by_selective =
            producer.op->name == "attention" ||
            (producer.op->name == "matmul" && (matmuls == Matmuls::all || matmul_index.at(p) % 2 == 0));
        EXPECT_TRUE(read_outside || from_parameter ||
                    (mode == sched::ActivationCheckpoint::selective && kept_by_selective))
            << "backward node " << n.index << " (" << node.op->name << ") reads " << t.g.describe_value(in) << " of "
            << producer.op->name << " in " << producer.scope;
      }
    }
    EXPECT_GT(recomputed_backward, 0u);
    EXPECT_GT(t.g.num_nodes(), before);
    EXPECT_FALSE(forward_block_reads.empty());
  }
}

// Selective with every other matmul kept (torchtitan's op policy): of each
// block's matmuls in forward order, backward reads the 1st, 3rd, ... where
// forward computed them and the 2nd, 4th, ... only as recomputed in
// backward; with all kept, no matmul is recomputed.
TEST(CheckpointActivations, EveryOtherMatmulIsRecomputedUnderSelective) {
  for (const auto matmuls : {sched::SelectiveMatmuls::all, sched::SelectiveMatmuls::every_other}) {
    SCOPED_TRACE(std::string(sched::selective_matmuls_name(matmuls)));
    StepGraph t;
    std::map<std::string, std::vector<NodeId>> block_matmuls;  // forward matmuls of each block, in order
    for (NodeId n : t.g.order()) {
      const Node& node = t.g.node(n);
      if (node.phase == Phase::forward && node.op->name == "matmul" && node.scope.rfind("layers.", 0) == 0)
        block_matmuls[node.scope.substr(0, node.scope.find('.', 7))].push_back(n);
    }
    ASSERT_EQ(block_matmuls.size(), 2u);
    EXPECT_TRUE(sched::checkpoint_activations(t.g, sched::ActivationCheckpoint::selective, matmuls));
    verify(t.g);
    std::set<NodeId> recomputed;  // forward matmuls recomputed in backward
    for (NodeId n : t.g.order())
      if (t.g.node(n).recomputes.valid() && t.g.node(n).op->name == "matmul") {
        EXPECT_EQ(t.g.node(n).phase, Phase::backward);
        recomputed.insert(t.g.node(n).recomputes);
      }
    for (const auto& [block, nodes] : block_matmuls) {
      ASSERT_EQ(nodes.size(), 7u) << block;  // q, k, v, o, w1, w3, w2
      for (size_t i = 0; i < nodes.size(); ++i) {
        const bool kept = matmuls == sched::SelectiveMatmuls::all || i % 2 == 0;
        EXPECT_EQ(recomputed.count(nodes[i]), kept ? 0u : 1u) << block << " matmul " << i + 1;
        // A recomputed output, backward no longer reads.
        bool read_by_backward = false;
        for (NodeId u : t.g.users(t.g.node(nodes[i]).outputs[0]))
          read_by_backward |= t.g.node(u).phase == Phase::backward;
        if (!kept) {
          EXPECT_FALSE(read_by_backward) << block << " matmul " << i + 1;
        }
      }
    }
  }
}
