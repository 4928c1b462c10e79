// Sharding propagation on small step graphs: the layouts it picks (golden
// text) for data parallel and FSDP-style parameters, and its errors.
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "mlp_step.h"
#include "spmd/lower.h"
#include "spmd/propagate.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using sharding::Layout;

namespace {

// y = x w^T: the graph several tests here lay out.
struct OneMatmul {
  Graph g;
  ValueId x, w, y;
  OneMatmul(const Shape& x_shape, const Shape& w_shape) {
    Builder b(g);
    x = g.add_input("x", x_shape, DType::f32);
    w = g.add_parameter("w", w_shape, DType::f32);
    y = b.matmul(x, w, false, true);
    g.add_output(y);
  }
  // The layouts the matmul reads x and w in.
  std::string inputs(const spmd::Sharding& s) const {
    const spmd::NodeSharding& matmul = s.nodes.at(g.value(y).producer);
    return matmul.inputs.at(0).to_string() + " " + matmul.inputs.at(1).to_string();
  }
};

}  // namespace

// FSDP: each weight gathered before its forward use (%3, %5); each weight
// gradient, a sum over the batch and so P(sum), reduce-scattered into the
// shard AdamW updates (%13, %10). The loss's gradient is broadcast straight
// into the batch's shards (%8); dH (%9) gathers w2 again (768 bytes) rather
// than contracting over its sharded rows and reduce-scattering the [64, 24]
// result (6144).
TEST(Propagate, FsdpGathersWeightsAndReduceScattersGradients) {
  mtest::Mlp mlp;
  EXPECT_EQ(
      mlp.propagated("S(0)"),
      "input %0:x: f32(64, 16) S(0)\n"
      "param %1:w1: f32(24, 16) S(0)\n"
      "param %2:w2: f32(8, 24) S(0)\n"
      "input %14:lr: f64() R\n"
      "input %15:step: i64() R\n"
      "input %16:m1: f32(24, 16) S(0)\n"
      "input %17:v1: f32(24, 16) S(0)\n"
      "input %21:m2: f32(8, 24) S(0)\n"
      "input %22:v2: f32(8, 24) S(0)\n"
      "%3: f32(64, 24) S(0) = matmul(%0, %1 S(0)->R)\n"
      "%4: f32(64, 24) S(0) = silu(%3)\n"
      "%5: f32(64, 8) S(0) = matmul(%4, %2 S(0)->R)\n"
      "%6: f32() R = sum(%5 S(0)->R)\n"
      "%7: f32() R = full()\n"
      "%8: f32(64, 8) S(0) = broadcast_scalar(%7)\n"
      "%9: f32(64, 24) S(0) = matmul(%8, %2 S(0)->R)\n"
      "%10: f32(8, 24) P(sum) = matmul(%8, %4)\n"
      "%11: f32(64, 24) S(0) = silu_backward(%3, %9)\n"
      "%13: f32(24, 16) P(sum) = matmul(%11, %0)\n"
      "%18: f32(24, 16) S(0), %19: f32(24, 16) S(0), %20: f32(24, 16) S(0) = adamw(%1, %13 P(sum)->S(0), %16, %17, %14, %15)\n"
      "%23: f32(8, 24) S(0), %24: f32(8, 24) S(0), %25: f32(8, 24) S(0) = adamw(%2, %10 P(sum)->S(0), %21, %22, %14, %15)\n"
      "outputs %6, %18, %19, %20, %23, %24, %25\n");
}

// DDP: replicated weights, so the forward needs nothing; each weight
// gradient all-reduced before the replicated AdamW (whose outputs must stay
// replicated, so sharding AdamW and gathering the results costs more).
TEST(Propagate, DdpAllReducesGradients) {
  mtest::Mlp mlp;
  EXPECT_EQ(
      mlp.propagated("R"),
      "input %0:x: f32(64, 16) S(0)\n"
      "param %1:w1: f32(24, 16) R\n"
      "param %2:w2: f32(8, 24) R\n"
      "input %14:lr: f64() R\n"
      "input %15:step: i64() R\n"
      "input %16:m1: f32(24, 16) R\n"
      "input %17:v1: f32(24, 16) R\n"
      "input %21:m2: f32(8, 24) R\n"
      "input %22:v2: f32(8, 24) R\n"
      "%3: f32(64, 24) S(0) = matmul(%0, %1)\n"
      "%4: f32(64, 24) S(0) = silu(%3)\n"
      "%5: f32(64, 8) S(0) = matmul(%4, %2)\n"
      "%6: f32() R = sum(%5 S(0)->R)\n"
      "%7: f32() R = full()\n"
      "%8: f32(64, 8) S(0) = broadcast_scalar(%7)\n"
      "%9: f32(64, 24) S(0) = matmul(%8, %2)\n"
      "%10: f32(8, 24) P(sum) = matmul(%8, %4)\n"
      "%11: f32(64, 24) S(0) = silu_backward(%3, %9)\n"
      "%13: f32(24, 16) P(sum) = matmul(%11, %0)\n"
      "%18: f32(24, 16) R, %19: f32(24, 16) R, %20: f32(24, 16) R = adamw(%1, %13 P(sum)->R, %16, %17, %14, %15)\n"
      "%23: f32(8, 24) R, %24: f32(8, 24) R, %25: f32(8, 24) R = adamw(%2, %10 P(sum)->R, %21, %22, %14, %15)\n"
      "outputs %6, %18, %19, %20, %23, %24, %25\n");
}

// An LM head under FSDP: 32768 tokens [32768, 256] split by rows, the
// vocabulary's weight [32768, 256] by rows. Splitting the contraction (both
// inputs all_to_all'd to S(1): 8 MiB each moves 6) looks cheaper than
// gathering either input (24 MiB received), but leaves every rank a pending
// sum of all the logits [32768, 32768] (4 GiB) that a reader must reduce:
// the reduction's bytes count, and one input is gathered instead.
TEST(Propagate, APendingSumCostsItsReduction) {
  const OneMatmul m({32768, 256}, {32768, 256});
  const sharding::DeviceMesh mesh({4});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::Sharding s =
      spmd::propagate(m.g, planner, {{m.x, Layout::parse("S(0)", 1)}, {m.w, Layout::parse("S(0)", 1)}});
  const std::string layouts = m.inputs(s);
  EXPECT_TRUE(layouts == "S(0) R" || layouts == "R S(0)") << layouts;
  EXPECT_NE(s.values.at(m.y).to_string(), "P(sum)");
}

// Two rows split over 8 ranks leave one rank half the work (the torch.chunk
// rule gives each of the first two a row, the others none), not an eighth:
// with the rows so given, the planner gathers them (32 KiB) and splits the
// weight's 4096 columns instead, each rank an eighth of the GEMM.
TEST(Propagate, AnUnevenSplitCostsItsBusiestRank) {
  const OneMatmul m({2, 4096}, {4096, 4096});
  const sharding::DeviceMesh mesh({8});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::Sharding s =
      spmd::propagate(m.g, planner, {{m.x, Layout::parse("S(0)", 1)}, {m.w, Layout::parse("R", 1)}});
  EXPECT_EQ(m.inputs(s), "R S(0)");
  EXPECT_EQ(s.values.at(m.y).to_string(), "S(1)");
}

// One step of look-ahead: gathering the rows (2 KiB) is cheaper than
// gathering the weight (16 KiB), but leaves the logits split by vocabulary,
// and cross_entropy reads rows: the all_to_all back (32 KiB) counts against
// that choice, so the weight is gathered and the logits come out in rows
// (the 8B CP 4 estimate's LM head, whose logits' all_to_all held 47 GiB).
TEST(Propagate, AReaderThatNeedsAnotherLayoutCostsItsProducer) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {64, 16}, DType::f32);
  const ValueId w = g.add_parameter("w", {512, 16}, DType::f32);
  const ValueId targets = g.add_input("targets", {64}, DType::i64);
  const ValueId logits = b.matmul(x, w, false, true);
  g.add_output(b.cross_entropy(logits, targets));
  const sharding::DeviceMesh mesh({2});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const Layout rows = Layout::parse("S(0)", 1);
  const spmd::Sharding s = spmd::propagate(g, planner, {{x, rows}, {w, rows}, {targets, rows}});
  const spmd::NodeSharding& matmul = s.nodes.at(g.value(logits).producer);
  EXPECT_EQ(matmul.inputs.at(0).to_string() + " " + matmul.inputs.at(1).to_string(), "S(0) R");
  EXPECT_EQ(s.values.at(logits).to_string(), "S(0)");
}

// A pipeline stage's programs run once per microbatch but gather its
// weights over dp_shard and cp once for all of them
// (PropagationOptions::parameter_share, parameter_gather_dims): a
// weight held split by its contraction dim (64 MiB) is then worth
// gathering, where one program alone moves the activations instead (1 MiB
// each way: the rows to columns, the partial sums back to rows).
TEST(Propagate, WeightsGatheredOnceARunCostTheirShare) {
  const OneMatmul m({64, 4096}, {4096, 4096});
  const sharding::DeviceMesh mesh({2});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const Layout rows = Layout::parse("S(0)", 1);
  auto inputs_at = [&](double share, const std::vector<int>& gather_dims) {
    return m.inputs(spmd::propagate(m.g, planner, {{m.x, rows}, {m.w, Layout::parse("S(1)", 1)}}, {{m.y, rows}},
                                    {.parameter_share = share, .parameter_gather_dims = gather_dims}));
  };
  EXPECT_EQ(inputs_at(1, {0}), "S(1) S(1)");
  EXPECT_EQ(inputs_at(1.0 / 64, {0}), "S(0) R");
  // Gathered over a dim not named (tp's), it would be held whole there all step: that costs in full.
  EXPECT_EQ(inputs_at(1.0 / 64, {}), "S(1) S(1)");
}

// Propagations that share a ChoiceCache (a search's stages and plans on one
// mesh) pick what each would alone: a second propagation of the same graph
// costs no node again, and options that change a choice are part of its key.
TEST(Propagate, PropagationsOnOnePlannerShareTheirChoices) {
  mtest::Mlp mlp;
  const sharding::DeviceMesh mesh({2});
  const auto planner = std::make_shared<sharding::Planner>(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::PropagationOptions shared{.choices = spmd::shared_choices(planner)};
  EXPECT_EQ(spmd::shared_choices(planner), shared.choices);
  for (const char* params : {"S(0)", "R"}) {
    const mtest::Mlp::Layouts l = mlp.layouts(params);
    const std::string alone = spmd::to_text(mlp.g, spmd::propagate(mlp.g, *planner, l.given, l.deliver));
    EXPECT_EQ(spmd::to_text(mlp.g, spmd::propagate(mlp.g, *planner, l.given, l.deliver, shared)), alone);
    const size_t known = shared.choices->size();
    EXPECT_GT(known, 0u);
    EXPECT_EQ(spmd::to_text(mlp.g, spmd::propagate(mlp.g, *planner, l.given, l.deliver, shared)), alone);
    EXPECT_EQ(shared.choices->size(), known) << params << ": the second propagation costed nodes again";
  }

  const OneMatmul m({64, 4096}, {4096, 4096});
  const Layout rows = Layout::parse("S(0)", 1);
  auto inputs_at = [&](double share) {
    spmd::PropagationOptions options = shared;
    options.parameter_share = share;
    options.parameter_gather_dims = {0};
    return m.inputs(
        spmd::propagate(m.g, *planner, {{m.x, rows}, {m.w, Layout::parse("S(1)", 1)}}, {{m.y, rows}}, options));
  };
  EXPECT_EQ(inputs_at(1), "S(1) S(1)");
  EXPECT_EQ(inputs_at(1.0 / 64), "S(0) R");
  EXPECT_EQ(inputs_at(1), "S(1) S(1)");
}

TEST(Propagate, Errors) {
  mtest::Mlp mlp;
  const sharding::DeviceMesh mesh({2});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] {
                                spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(0)R", 2)}});
                              }),
                              "x: f32(64, 16) has layout S(0)R for a 1-d mesh"));
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] {
                                spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(2)", 1)}});
                              }),
                              "tensor dim 2"));
  const std::string undeliverable = mtest::message_of([&] {
    spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(0)", 1)}}, {{mlp.loss, Layout::parse("P(max)", 1)}});
  });
  EXPECT_TRUE(mtest::contains(
      undeliverable, "no legal strategy for node 3 (sum), whose output sum.3: f32() must be delivered as P(max)"))
      << undeliverable;
}

// The lowered graph of each rank: local shapes by the torch.chunk rule
// (uneven over 3 ranks) and one node per redistribution step, with its group.
TEST(Lower, FsdpOnThreeRanksUneven) {
  mtest::Mlp mlp;
  const sharding::DeviceMesh mesh({3});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const auto sharding = mlp.propagate(planner, "S(0)");
  // Rank 2 holds rows 44..63 of x (64 = 22 + 22 + 20), 8 of w1's 24 rows and
  // 2 of w2's 8 (3 + 3 + 2).
  EXPECT_EQ(
      to_text(spmd::lower(mlp.g, sharding, planner, 2).graph),
      "input %0:x: f32(20, 16)\n"
      "param %1:w1: f32(8, 16)\n"
      "param %2:w2: f32(2, 24)\n"
      "input %3:lr: f64()\n"
      "input %4:step: i64()\n"
      "input %5:m1: f32(8, 16)\n"
      "input %6:v1: f32(8, 16)\n"
      "input %7:m2: f32(2, 24)\n"
      "input %8:v2: f32(2, 24)\n"
      "%9: f32(24, 16), %10: f32(0) = all_gather(%1:w1) {after=R, before=S(0), buffer=0, bytes=1536, global_shape=[24, 16], group=[0, 1, 2], mesh_dims=[0], shape=[24, 16]}  # forward\n"
      "%11: f32(24, 16) = wait(%9, %10, %1:w1)  # forward\n"
      "%12: f32(20, 24) = matmul(%0:x, %11) {transpose_a=false, transpose_b=true}  # forward\n"
      "%13: f32(20, 24) = silu(%12)  # forward\n"
      "%14: f32(8, 24), %15: f32(0) = all_gather(%2:w2) {after=R, before=S(0), buffer=0, bytes=768, global_shape=[8, 24], group=[0, 1, 2], mesh_dims=[0], shape=[8, 24]}  # forward\n"
      "%16: f32(8, 24) = wait(%14, %15, %2:w2)  # forward\n"
      "%17: f32(20, 8) = matmul(%13, %16) {transpose_a=false, transpose_b=true}  # forward\n"
      "%18: f32(64, 8), %19: f32(0) = all_gather(%17) {after=R, before=S(0), buffer=0, bytes=2048, global_shape=[64, 8], group=[0, 1, 2], mesh_dims=[0], shape=[64, 8]}  # forward\n"
      "%20: f32(64, 8) = wait(%18, %19, %17)  # forward\n"
      "%21: f32() = sum(%20)  # forward\n"
      "%22: f32() = full() {dtype=f32, shape=[], value=1}  # backward\n"
      "%23: f32(20, 8) = broadcast_scalar(%22) {shape=[20, 8]}  # backward\n"
      "%24: f32(8, 24), %25: f32(0) = all_gather(%2:w2) {after=R, before=S(0), buffer=0, bytes=768, global_shape=[8, 24], group=[0, 1, 2], mesh_dims=[0], shape=[8, 24]}  # backward\n"
      "%26: f32(8, 24) = wait(%24, %25, %2:w2)  # backward\n"
      "%27: f32(20, 24) = matmul(%23, %26) {transpose_a=false, transpose_b=false}  # backward\n"
      "%28: f32(8, 24) = matmul(%23, %13) {transpose_a=true, transpose_b=false}  # backward\n"
      "%29: f32(20, 24) = silu_backward(%12, %27)  # backward\n"
      "%30: f32(24, 16) = matmul(%29, %0:x) {transpose_a=true, transpose_b=false}  # backward\n"
      "%31: f32(8, 16), %32: f32(0) = reduce_scatter(%30) {after=S(0), before=P(sum), buffer=0, bytes=1536, global_shape=[24, 16], group=[0, 1, 2], mesh_dims=[0], shape=[8, 16]}  # forward\n"
      "%33: f32(8, 16) = wait(%31, %32, %30)  # forward\n"
      "%34: f32(8, 16), %35: f32(8, 16), %36: f32(8, 16) = adamw(%1:w1, %33, %5:m1, %6:v1, %3:lr, %4:step) {beta1=0.9, beta2=0.95, eps=1e-08, weight_decay=0.1}  # forward\n"
      "%37: f32(2, 24), %38: f32(0) = reduce_scatter(%28) {after=S(0), before=P(sum), buffer=0, bytes=768, global_shape=[8, 24], group=[0, 1, 2], mesh_dims=[0], shape=[2, 24]}  # forward\n"
      "%39: f32(2, 24) = wait(%37, %38, %28)  # forward\n"
      "%40: f32(2, 24), %41: f32(2, 24), %42: f32(2, 24) = adamw(%2:w2, %39, %7:m2, %8:v2, %3:lr, %4:step) {beta1=0.9, beta2=0.95, eps=1e-08, weight_decay=0.1}  # forward\n"
      "outputs %21, %34, %35, %36, %40, %41, %42\n");
  const auto rank0 = spmd::lower(mlp.g, sharding, planner, 0);
  EXPECT_EQ(rank0.graph.value(rank0.values.at(mlp.x)).info.shape, (Shape{22, 16}));
  EXPECT_EQ(rank0.graph.value(rank0.values.at(mlp.w2)).info.shape, (Shape{3, 24}));
  verify(rank0.graph);
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { spmd::lower(mlp.g, sharding, planner, 3); }),
                              "rank 3 is outside the mesh (d0=3) of 3 ranks"));
}
