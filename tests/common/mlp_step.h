// A small training step for spmd tests: loss = sum(silu(x w1^T) w2^T), its
// backward, and AdamW on w1 and w2 (dead nodes removed); and propagation of
// it on a 1-d mesh.
#pragma once

#include <map>
#include <string>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "sched/passes/dead_code.h"
#include "spmd/propagate.h"

namespace mtest {

using namespace meshtrain;
using namespace meshtrain::graph;
using sharding::Layout;

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
  // On a 1-d mesh: x sharded by batch, the parameters and their moments in
  // `param_layout` (and their updates delivered so), the loss replicated.
  struct Layouts {
    std::map<ValueId, Layout> given, deliver;
  };
  Layouts layouts(const std::string& param_layout) const {
    const Layout p = Layout::parse(param_layout, 1);
    Layouts l{{{x, Layout::parse("S(0)", 1)}, {w1, p}, {w2, p}}, {{loss, Layout::parse("R", 1)}}};
    for (ValueId v : states) l.given[v] = p;
    for (ValueId u : updates) l.deliver[u] = p;
    return l;
  }
  spmd::Sharding propagate(sharding::Planner& planner, const std::string& param_layout) {
    const Layouts l = layouts(param_layout);
    return spmd::propagate(g, planner, l.given, l.deliver);
  }
  std::string propagated(const std::string& param_layout) {
    const sharding::DeviceMesh mesh({2});
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    return spmd::to_text(g, propagate(planner, param_layout));
  }
};

}  // namespace mtest
