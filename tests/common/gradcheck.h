// Autodiff gradients against central finite differences in float64 (the
// check every op's backward passes), for tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "sched/schedule.h"

namespace mtest {

using namespace meshtrain;
using namespace meshtrain::graph;

struct InputSpec {
  InputSpec(Shape s, DType d = DType::f64, std::vector<int64_t> ints = {})
      : shape(std::move(s)), dtype(d), int_values(std::move(ints)) {}
  Shape shape;
  DType dtype;
  std::vector<int64_t> int_values;  // for i64 inputs (ids, targets)
};

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, double lo = -1.5, double hi = 1.5) {
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(shape, DType::f64);
  for (double& x : t.data<double>()) x = u(rng);
  return t;
}

// loss = sum(f(inputs) * R) with a random R; compares autodiff gradients of
// every float input with (L(x+h) - L(x-h)) / 2h, element by element.
inline void gradcheck(const std::vector<InputSpec>& specs,
                      const std::function<ValueId(Builder&, const std::vector<ValueId>&)>& f, double tolerance = 1e-7) {
  std::mt19937 rng(7);
  Graph g;
  Builder b(g);
  std::vector<ValueId> ids;
  std::vector<Tensor> values;
  for (size_t i = 0; i < specs.size(); ++i) {
    ids.push_back(g.add_input(fmt::format("x{}", i), specs[i].shape, specs[i].dtype));
    if (specs[i].dtype == DType::i64) {
      Tensor t = Tensor::empty(specs[i].shape, DType::i64);
      std::copy(specs[i].int_values.begin(), specs[i].int_values.end(), t.data<int64_t>().begin());
      values.push_back(t);
    } else {
      values.push_back(random_tensor(specs[i].shape, rng));
    }
  }
  const ValueId y = f(b, ids);
  const ValueId r = g.add_input("r", g.value(y).info.shape, DType::f64);
  const ValueId loss = b.sum(b.mul(y, r));
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].dtype == DType::f64) wrt.push_back(ids[i]);
  const std::vector<ValueId> grads = append_backward(g, loss, wrt);
  std::vector<ValueId> fetches{loss};
  for (ValueId gv : grads) {
    ASSERT_TRUE(gv.valid()) << "no gradient reached an input";
    fetches.push_back(gv);
  }
  runtime::Executor ex(g, sched::make_schedule(g, fetches));
  for (size_t i = 0; i < specs.size(); ++i) ex.bind(ids[i], values[i]);
  ex.bind(r, random_tensor(g.value(y).info.shape, rng));
  ex.run();
  std::vector<Tensor> analytic;
  for (ValueId gv : grads) analytic.push_back(ex.fetch(gv).clone());
  auto loss_now = [&] {
    ex.run();
    return ex.fetch(loss).data<double>()[0];
  };
  const double h = 1e-6;
  size_t w = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].dtype != DType::f64) continue;
    auto x = values[i].data<double>();
    const auto a = analytic[w++].data<const double>();
    for (size_t j = 0; j < x.size(); ++j) {
      const double saved = x[j];
      x[j] = saved + h;
      const double up = loss_now();
      x[j] = saved - h;
      const double down = loss_now();
      x[j] = saved;
      const double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(a[j], numeric, tolerance * std::max(1.0, std::fabs(numeric))) << "input " << i << " element " << j;
    }
  }
}

}  // namespace mtest
