// Checks of a lowered step for tests, on any backend: each rank runs its
// lowered graph of the small MLP step (mlp_step.h) on its shards of the same
// global inputs and compares every output with its shard of the single-rank
// run.
#pragma once

#include <gtest/gtest.h>

#include <random>

#include "comm/process_group.h"
#include "compile/train_step.h"
#include "mlp_step.h"
#include "models/llama.h"
#include "parallel/plan.h"
#include "runtime/executor.h"
#include "sched/pass.h"
#include "sched/schedule.h"
#include "sharding/local_chunk.h"
#include "spmd/lower.h"

namespace mtest {

using sharding::local_piece;

struct Inputs {
  std::map<ValueId, Tensor> values;  // every input and parameter of the global graph
};

inline Inputs make_inputs(const Graph& g) {
  std::mt19937 rng(17);
  std::normal_distribution<double> normal(0.0, 0.3);
  Inputs in;
  for (int i = 0; i < g.num_values(); ++i) {
    const ValueId v(i);
    const Value& val = g.value(v);
    if (val.kind == ValueKind::intermediate) continue;
    Tensor t = Tensor::zeros(val.info.shape, val.info.dtype);
    if (val.name == "lr")
      t.set(0, 1e-2);
    else if (val.name == "step")
      t.set(0, 1);
    else if (val.name[0] != 'm' && val.name[0] != 'v')
      for (int64_t k = 0; k < t.numel(); ++k) t.set(k, normal(rng));
    in.values[v] = t;
  }
  return in;
}

// The single-rank run: every graph output.
inline std::vector<Tensor> run_single(const Graph& g, const Inputs& in) {
  runtime::Executor ex(g, sched::make_schedule(g, g.outputs()));
  for (const auto& [v, t] : in.values) ex.bind(v, t);
  ex.run();
  std::vector<Tensor> out;
  for (ValueId v : g.outputs()) out.push_back(ex.fetch(v).clone());
  return out;
}

// On this rank: propagate `g` with `given` / `deliver` on `mesh` (every rank
// of `pg`), lower it for this rank, run it on this rank's pieces of `in`
// and compare every graph output with its piece of the single-rank run
// `want`, within `tolerance` (relative, at least 1 absolute). Returns the
// outputs compared.
inline int check_lowered(comm::ProcessGroup& pg, const sharding::DeviceMesh& mesh, const Graph& g,
                         const std::map<ValueId, Layout>& given, const std::map<ValueId, Layout>& deliver,
                         const Inputs& in, const std::vector<Tensor>& want, double tolerance, const std::string& what) {
  sharding::MeshGroups groups(mesh, pg.shared_from_this());
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::Sharding s = spmd::propagate(g, planner, given, deliver);
  if (std::getenv("MT_DUMP") && pg.rank() == 0) fmt::print("{}\n", spmd::to_text(g, s));
  spmd::LoweredGraph lowered = spmd::lower(g, s, planner, pg.rank());
  sched::lowered_step_pipeline().run(lowered.graph);  // waits sunk, as the trainer runs it
  const Graph& local = lowered.graph;
  runtime::Executor ex(local, sched::make_schedule(local, local.outputs()), &groups);
  for (const auto& [v, t] : in.values)
    ex.bind(lowered.values.at(v), local_piece(t, s.values.at(v), mesh, groups.coordinate()));
  ex.run();
  int compared = 0;
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    const ValueId v = g.outputs()[k];
    const Tensor got = ex.fetch(local.outputs()[k]);
    const Tensor expect = local_piece(want[k], s.outputs.at(v), mesh, groups.coordinate());
    EXPECT_EQ(got.shape(), expect.shape()) << g.describe_value(v);
    if (got.shape() != expect.shape()) continue;
    for (int64_t i = 0; i < got.numel(); ++i)
      EXPECT_NEAR(got.get(i), expect.get(i), tolerance * std::max(1.0, std::fabs(expect.get(i))))
          << g.describe_value(v) << " element " << i << " on rank " << pg.rank() << ", " << what;
    ++compared;
  }
  return compared;
}

// The MLP step laid out with `param_layout` on a 1-d mesh of every rank of `pg`.
inline int check_lowered_step(comm::ProcessGroup& pg, const std::string& param_layout) {
  Mlp mlp;
  const Inputs in = make_inputs(mlp.g);
  const Mlp::Layouts l = mlp.layouts(param_layout);
  return check_lowered(pg, sharding::DeviceMesh({pg.size()}), mlp.g, l.given, l.deliver, in, run_single(mlp.g, in),
                       1e-5, "parameters " + param_layout);
}

// A whole Llama training step (train::build_train_step: forward, backward,
// clipping, AdamW) of a tiny model (8 query heads over 4 kv heads, 11 vocab
// rows so every split of them is uneven), laid out by the parallel plan of
// `parallel` (parallel::step_layouts with Megatron's Llama tp dims) on the
// mesh it makes of every rank of `pg`. The loss, grad_norm, and param, m, v
// of each of 21 parameters (9 per layer, the embedding, the final norm and
// lm_head).
inline constexpr int kLlamaStepOutputs = 2 + 3 * 21;
inline models::LlamaConfig tiny_llama() {
  models::LlamaConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn_dim = 12;
  c.vocab_size = 11;
  return c;
}

// The tiny Llama's step for a global batch of 4 sequences of 5 tokens, and its layouts under `parallel`.
struct TinyLlamaStep {
  Graph g;
  compile::TrainStepGraph step;
  sharding::DeviceMesh mesh;
  parallel::StepLayouts layouts;
  TinyLlamaStep(const parallel::ParallelConfig& parallel, int ranks, int64_t micro_batches = 1)
      : mesh(parallel::make_mesh(parallel, ranks)) {
    config::OptimizerConfig opt = config::TrainConfig().optimizer;
    opt.lr = 1e-2;
    step = compile::build_train_step(g, tiny_llama(), 4, 5, opt,
                                     {.max_grad_norm = 0.5,
                                      .split_loss = parallel.loss_parallel,
                                      .micro_batches = micro_batches});  // clipping active
    sched::step_pipeline().run(g);
    layouts = parallel::step_layouts(mesh, g, compile::step_roles(step, mesh.size(mesh.dim_index("tp")) > 1), parallel);
  }
};

inline int check_llama_step(comm::ProcessGroup& pg, const parallel::ParallelConfig& parallel,
                            int64_t micro_batches = 1) {
  const models::LlamaConfig c = tiny_llama();
  TinyLlamaStep tiny(parallel, pg.size(), micro_batches);
  const Graph& g = tiny.g;
  const compile::TrainStepGraph& step = tiny.step;
  EXPECT_EQ(static_cast<int>(g.outputs().size()), kLlamaStepOutputs);
  Inputs in;
  std::mt19937 rng(23);
  std::normal_distribution<double> normal(0.0, 0.3);
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  for (int i = 0; i < g.num_values(); ++i) {
    const ValueId v(i);
    const Value& val = g.value(v);
    if (val.kind == ValueKind::intermediate) continue;
    Tensor t = Tensor::zeros(val.info.shape, val.info.dtype);
    if (v == step.lr)
      t.set(0, 1e-2);
    else if (v == step.step)
      t.set(0, 1);
    else if (val.info.dtype == DType::i64)
      for (int64_t k = 0; k < t.numel(); ++k) t.set(k, static_cast<double>(token(rng)));
    else if (val.kind == ValueKind::parameter)
      for (int64_t k = 0; k < t.numel(); ++k) t.set(k, normal(rng));
    in.values[v] = t;
  }
  in.values.at(step.model.targets).set(3, -100);  // an ignored position
  return check_lowered(pg, tiny.mesh, g, tiny.layouts.given, tiny.layouts.deliver, in, run_single(g, in), 1e-5,
                       fmt::format("Llama step on mesh {}", tiny.mesh.describe()));
}

// Parallel configs by name, for tests.
inline parallel::ParallelConfig fsdp() { return {}; }
inline parallel::ParallelConfig ddp(int64_t ranks) { return {.dp_replicate = ranks, .dp_shard = 1}; }
inline parallel::ParallelConfig tp(int64_t tp) { return {.tp = tp}; }

}  // namespace mtest
