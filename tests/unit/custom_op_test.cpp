// An op defined outside graph/ops, as an extension would: its definition
// (register_op) and its CPU kernel (register_cpu_kernel) in this one file,
// and nothing else changed. It runs, differentiates and is counted like a
// built-in op.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "graph/op_registry.h"
#include "kernels/cpu/op_kernels.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;

namespace {

// cube(x) = x^3, elementwise; d/dx = 3 x^2.
void register_cube() {
  static const bool done = [] {
    register_op({
        .name = "test_cube",
        .infer =
            [](const ValueInfos& in, const Attrs&) {
              MT_CHECK(in[0].dtype == DType::f64 || in[0].dtype == DType::f32, "test_cube takes f32 or f64");
              return ValueInfos{in[0]};
            },
        .backward =
            [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
              const ValueId x = n.inputs[0];
              return std::vector<ValueId>{b.mul(g[0], b.scale(b.mul(x, x), 3.0))};
            },
        .flops = [](const ValueInfos&, const ValueInfos& out,
                    const Attrs&) { return 2.0 * static_cast<double>(out[0].shape.numel()); },
    });
    kernels::cpu::register_cpu_kernel("test_cube", [](const kernels::cpu::KernelArgs& a) {
      auto cube = [&](auto zero) {
        using T = decltype(zero);
        const T* x = static_cast<const T*>(a.in[0]->raw());
        T* y = static_cast<T*>(a.out[0]->raw());
        for (int64_t i = 0; i < a.out[0]->numel(); ++i) y[i] = x[i] * x[i] * x[i];
      };
      a.in[0]->dtype() == DType::f64 ? cube(double{}) : cube(float{});
    });
    return true;
  }();
  (void)done;
}

}  // namespace

TEST(CustomOp, RunsAndDifferentiatesLikeABuiltIn) {
  register_cube();
  Graph g;
  const ValueId x = g.add_input("x", {2, 3}, DType::f32);
  const ValueId y = Builder(g).op("test_cube", {x});
  runtime::Executor ex(g, sched::make_schedule(g, {y}));
  Tensor xt = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 6; ++i) xt.set(i, 0.5 * i - 1.0);
  ex.bind(x, xt);
  ex.run();
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(ex.fetch(y).get(i), std::pow(0.5 * i - 1.0, 3));
  EXPECT_DOUBLE_EQ(ex.flops(), 12);

  mtest::gradcheck({{{3, 5}}}, [](Builder& b, const std::vector<ValueId>& in) { return b.op("test_cube", {in[0]}); });
}

TEST(CustomOp, ClearErrors) {
  register_cube();
  EXPECT_TRUE(
      mtest::contains(mtest::message_of([] { register_op({.name = "test_cube", .infer = find_op("add").infer}); }),
                      "an op named 'test_cube' is already registered"));
  EXPECT_TRUE(mtest::contains(
      mtest::message_of([] { kernels::cpu::register_cpu_kernel("add", [](const kernels::cpu::KernelArgs&) {}); }),
      "op 'add' already has a CPU kernel"));
  // An op without a kernel fails when an executor plans it, naming the op.
  static const bool defined = [] {
    register_op(
        {.name = "test_no_kernel", .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; }});
    return true;
  }();
  (void)defined;
  Graph g;
  const ValueId y = Builder(g).op("test_no_kernel", {g.add_input("x", {2}, DType::f32)});
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { runtime::Executor ex(g, sched::make_schedule(g, {y})); }),
                              "op test_no_kernel has no CPU kernel"));
}
