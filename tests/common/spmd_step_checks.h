// Checks of a lowered step for tests, on any backend: each rank runs its
// lowered graph of the small MLP step (mlp_step.h) on its shards of the same
// global inputs and compares every output with its shard of the single-rank
// run.
#pragma once

#include <gtest/gtest.h>

#include <random>

#include "comm/process_group.h"
#include "mlp_step.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "sharding/local_chunk.h"
#include "spmd/lower.h"

namespace mtest {

// This rank's piece of a global tensor under a layout (no partials).
Tensor local_piece(const Tensor& global, const sharding::Layout& layout, const sharding::DeviceMesh& mesh,
                   const std::vector<int>& coord) {
  const auto chunk = sharding::local_chunk(global.shape(), layout, mesh, coord);
  std::vector<std::vector<int64_t>> idx;
  for (size_t d = 0; d < global.shape().rank(); ++d)
    idx.push_back(sharding::shard_indices(global.shape()[d], layout, static_cast<int>(d), mesh, coord));
  Tensor t = Tensor::empty(chunk.shape, global.dtype());
  const size_t rank = global.shape().rank();
  std::vector<int64_t> pos(rank, 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * global.shape()[d] + idx[d][static_cast<size_t>(pos[d])];
    t.set(i, global.get(flat));
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++pos[static_cast<size_t>(d)] < chunk.shape[static_cast<size_t>(d)]) break;
      pos[static_cast<size_t>(d)] = 0;
    }
  }
  return t;
}

struct Inputs {
  std::map<ValueId, Tensor> values;  // every input and parameter of the global graph
};

Inputs make_inputs(const Graph& g) {
  std::mt19937 rng(17);
  std::normal_distribution<double> normal(0.0, 0.3);
  Inputs in;
  for (int i = 0; i < g.num_values(); ++i) {
    const ValueId v(i);
    const Value& val = g.value(v);
    if (val.kind == ValueKind::intermediate) continue;
    Tensor t = Tensor::zeros(val.info.shape, val.info.dtype);
    if (val.name == "lr") t.set(0, 1e-2);
    else if (val.name == "step") t.set(0, 1);
    else if (val.name[0] != 'm' && val.name[0] != 'v')
      for (int64_t k = 0; k < t.numel(); ++k) t.set(k, normal(rng));
    in.values[v] = t;
  }
  return in;
}

// The single-rank run: every graph output.
std::vector<Tensor> run_single(const Graph& g, const Inputs& in) {
  runtime::Executor ex(g, sched::make_schedule(g, g.outputs()));
  for (const auto& [v, t] : in.values) ex.bind(v, t);
  ex.run();
  std::vector<Tensor> out;
  for (ValueId v : g.outputs()) out.push_back(ex.fetch(v).clone());
  return out;
}

// On this rank: lower the step laid out with `param_layout` on a 1-d mesh of
// every rank of `pg`, run it, and compare. Returns the outputs compared.
inline int check_lowered_step(comm::ProcessGroup& pg, const std::string& param_layout) {
  Mlp mlp;
  const Inputs in = make_inputs(mlp.g);
  const std::vector<Tensor> want = run_single(mlp.g, in);
  const sharding::DeviceMesh mesh({pg.size()});
  int compared = 0;
  sharding::MeshGroups groups(mesh, pg.shared_from_this());
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::Sharding s = mlp.propagate(planner, param_layout);
  const spmd::LoweredGraph lowered = spmd::lower(mlp.g, s, planner, pg.rank());
  const Graph& local = lowered.graph;
  runtime::Executor ex(local, sched::make_schedule(local, local.outputs()), &groups);
  for (const auto& [v, t] : in.values) ex.bind(lowered.values.at(v), local_piece(t, s.values.at(v), mesh, groups.coordinate()));
  ex.run();
  for (size_t k = 0; k < mlp.g.outputs().size(); ++k) {
    const ValueId v = mlp.g.outputs()[k];
    const Tensor got = ex.fetch(local.outputs()[k]);
    const Tensor expect = local_piece(want[k], s.outputs.at(v), mesh, groups.coordinate());
    EXPECT_EQ(got.shape(), expect.shape()) << mlp.g.describe_value(v);
    if (got.shape() != expect.shape()) continue;
    for (int64_t i = 0; i < got.numel(); ++i)
      EXPECT_NEAR(got.get(i), expect.get(i), 1e-5 * std::max(1.0, std::fabs(expect.get(i))))
          << mlp.g.describe_value(v) << " element " << i << " on rank " << pg.rank() << ", parameters " << param_layout;
    ++compared;
  }
  return compared;
}

}  // namespace mtest
