// Sharding propagation on small step graphs: the layouts it picks (golden
// text) for data parallel and FSDP-style parameters, and its errors.
#include <gtest/gtest.h>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "sched/passes/dead_code.h"
#include "spmd/propagate.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using sharding::Layout;

namespace {

// loss = sum(silu(x w1^T) w2^T); AdamW on w1 and w2.
struct Mlp {
  Graph g;
  ValueId x, w1, w2, loss;
  std::vector<ValueId> states;   // m, v of w1 then of w2
  std::vector<ValueId> updates;  // w1, m1, v1, w2, m2, v2 after the step
  Mlp() {
    Builder b(g);
    x = g.add_input("x", {64, 16}, DType::f32);
    w1 = g.add_parameter("w1", {24, 16}, DType::f32);
    w2 = g.add_parameter("w2", {8, 24}, DType::f32);
    loss = b.sum(b.matmul(b.silu(b.matmul(x, w1, false, true)), w2, false, true));
    const auto grads = append_backward(g, loss, {w1, w2});
    const ValueId lr = g.add_input("lr", {}, DType::f64), step = g.add_input("step", {}, DType::i64);
    g.add_output(loss);
    for (size_t i = 0; i < 2; ++i) {
      const ValueId w = i == 0 ? w1 : w2;
      const ValueId m = g.add_input(fmt::format("m{}", i + 1), g.value(w).info.shape, DType::f32);
      const ValueId v = g.add_input(fmt::format("v{}", i + 1), g.value(w).info.shape, DType::f32);
      states.insert(states.end(), {m, v});
      for (ValueId u : b.adamw(w, grads[i], m, v, lr, step, 0.9, 0.95, 1e-8, 0.1)) {
        g.add_output(u);
        updates.push_back(u);
      }
    }
    sched::remove_dead_nodes(g);  // the gradient of x
  }
  // Propagation on a 1-d mesh of 2 ranks, x sharded by batch, the parameters
  // and their moments in `param_layout`, the loss delivered replicated.
  std::string propagated(const std::string& param_layout) {
    const sharding::DeviceMesh mesh({2});
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    const Layout p = Layout::parse(param_layout, 1);
    std::map<ValueId, Layout> given{{x, Layout::parse("S(0)", 1)}, {w1, p}, {w2, p}};
    for (ValueId v : states) given[v] = p;
    std::map<ValueId, Layout> deliver{{loss, Layout::parse("R", 1)}};
    for (ValueId u : updates) deliver[u] = p;
    return spmd::to_text(g, spmd::propagate(g, planner, given, deliver));
  }
};

}  // namespace

// FSDP: each weight gathered before its forward use (%3, %5); each weight
// gradient, a sum over the batch and so P(sum), reduce-scattered into the
// shard AdamW updates (%13, %10). dH (%9) contracts over w2's sharded rows
// rather than gathering w2 again, and is reduce-scattered by batch. The
// gradient of the loss (%7, %8) is replicated: broadcast_scalar has no rule yet.
TEST(Propagate, FsdpGathersWeightsAndReduceScattersGradients) {
  Mlp mlp;
  EXPECT_EQ(mlp.propagated("S(0)"),
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
            "%7: f32() R = full()  # no strategy rule: replicated\n"
            "%8: f32(64, 8) R = broadcast_scalar(%7)  # no strategy rule: replicated\n"
            "%9: f32(64, 24) P(sum) = matmul(%8 R->S(1), %2)\n"
            "%10: f32(8, 24) P(sum) = matmul(%8 R->S(0), %4)\n"
            "%11: f32(64, 24) S(0) = silu_backward(%3, %9 P(sum)->S(0))\n"
            "%13: f32(24, 16) P(sum) = matmul(%11, %0)\n"
            "%18: f32(24, 16) S(0), %19: f32(24, 16) S(0), %20: f32(24, 16) S(0) = adamw(%1, %13 P(sum)->S(0), %16, %17, %14, %15)\n"
            "%23: f32(8, 24) S(0), %24: f32(8, 24) S(0), %25: f32(8, 24) S(0) = adamw(%2, %10 P(sum)->S(0), %21, %22, %14, %15)\n"
            "outputs %6, %18, %19, %20, %23, %24, %25\n");
}

// DDP: replicated weights, so the forward needs nothing; each weight
// gradient all-reduced before the replicated AdamW (whose outputs must stay
// replicated, so sharding AdamW and gathering the results costs more).
TEST(Propagate, DdpAllReducesGradients) {
  Mlp mlp;
  EXPECT_EQ(mlp.propagated("R"),
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
            "%7: f32() R = full()  # no strategy rule: replicated\n"
            "%8: f32(64, 8) R = broadcast_scalar(%7)  # no strategy rule: replicated\n"
            "%9: f32(64, 24) S(0) = matmul(%8 R->S(0), %2)\n"
            "%10: f32(8, 24) P(sum) = matmul(%8 R->S(0), %4)\n"
            "%11: f32(64, 24) S(0) = silu_backward(%3, %9)\n"
            "%13: f32(24, 16) P(sum) = matmul(%11, %0)\n"
            "%18: f32(24, 16) R, %19: f32(24, 16) R, %20: f32(24, 16) R = adamw(%1, %13 P(sum)->R, %16, %17, %14, %15)\n"
            "%23: f32(8, 24) R, %24: f32(8, 24) R, %25: f32(8, 24) R = adamw(%2, %10 P(sum)->R, %21, %22, %14, %15)\n"
            "outputs %6, %18, %19, %20, %23, %24, %25\n");
}

TEST(Propagate, Errors) {
  Mlp mlp;
  const sharding::DeviceMesh mesh({2});
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(0)R", 2)}}); }),
                              "x: f32(64, 16) has layout S(0)R for a 1-d mesh"));
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(2)", 1)}}); }),
                              "tensor dim 2"));
  const std::string undeliverable = mtest::message_of([&] {
    spmd::propagate(mlp.g, planner, {{mlp.x, Layout::parse("S(0)", 1)}}, {{mlp.loss, Layout::parse("P(max)", 1)}});
  });
  EXPECT_TRUE(mtest::contains(undeliverable, "no legal strategy for node 3 (sum), whose output sum.3: f32() must be delivered as P(max)"))
      << undeliverable;
}
