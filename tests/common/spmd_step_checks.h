// Checks of a lowered step for tests, on any backend: each rank runs two
// optimizer steps of its lowered graph of the small MLP step (mlp_step.h) or
// of a tiny Llama's step on its shards of the same global inputs, the second
// from the state the first left, and compares every output of each step
// (loss, grad_norm, parameters, m and v) with its shard of the single-rank
// run's, relative to the tensor's scale.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
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

// A training step's state: each updated output (the new parameter, m or v)
// and the input it replaces at the next step.
struct StepState {
  std::vector<std::pair<ValueId, ValueId>> write_backs;  // graph output -> its input
  ValueId step;                                          // the i64 step counter (bias correction)
};

// The next step's inputs: `in` with each state input replaced by its output in `outputs` (of graph `g`) and the
// step counter one further.
inline Inputs next_inputs(const Graph& g, const Inputs& in, const std::vector<Tensor>& outputs,
                          const StepState& state) {
  Inputs next = in;
  for (const auto& [out, buffer] : state.write_backs) {
    const auto k = std::find(g.outputs().begin(), g.outputs().end(), out) - g.outputs().begin();
    next.values[buffer] = outputs.at(static_cast<size_t>(k)).clone();
  }
  Tensor step = Tensor::zeros({}, DType::i64);
  step.set(0, in.values.at(state.step).get(0) + 1);
  next.values[state.step] = step;
  return next;
}

// How close a step's outputs must be to the single-rank run's, by kind of
// output: the loss and grad_norm, the updated parameters, and the updated
// moments m and v (after the first step, from zero moments, m and v are
// (1 - beta) x the clipped gradients and their squares: comparing them
// compares the gradients). Each relative to its tensor: the largest
// |got - want| over the largest |want| (a parameter's, a gradient's norm;
// the max norm), so that v (about 1e-6 here) is held to its own scale.
struct StepTolerances {
  double scalars, parameters, moments;
};

// The largest error of each kind, relative to its tensor.
struct StepErrors {
  double scalars = 0, parameters = 0, moments = 0;
};

// `got` against `want`: max |got - want| <= tolerance x max |want| (a
// tensor of zeros must come out zeros). Returns max |got - want| / max |want|.
inline double expect_close(const Tensor& got, const Tensor& want, double tolerance, const std::string& what) {
  double largest = 0, worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    largest = std::max(largest, std::fabs(want.get(i)));
    if (const double err = std::fabs(got.get(i) - want.get(i)); err > worst) {
      worst = err;
      at = i;
    }
  }
  const double relative = worst == 0 ? 0 : largest > 0 ? worst / largest : HUGE_VAL;
  EXPECT_LE(relative, tolerance) << what << ": element " << at << " is " << got.get(at) << ", the single rank's "
                                 << want.get(at) << " (max |difference| " << worst << ", max |value| " << largest
                                 << ")";
  return relative;
}

// On this rank: propagate `g` with `given` / `deliver` on `mesh` (every rank
// of `pg`), lower it for this rank, and run `steps` optimizer steps of it on
// this rank's pieces of `in`, each from the state (parameters, m, v) the
// rank's previous step left, as the trainer runs them; compare every graph
// output of every step with its piece of the single-rank run's within
// `tolerances`. Two steps at least: after the first (from zero moments)
// AdamW moves each weight by about lr x the sign of its gradient; the
// second's update depends on the gradients' magnitudes. Returns the outputs
// compared in a step; `errors` (if given) gets the largest errors. With
// `async_tp`, the lowered graph also goes through sched::async_tp over the
// mesh's tp dim, which must rewrite it.
inline int check_lowered(comm::ProcessGroup& pg, const sharding::DeviceMesh& mesh, const Graph& g,
                         const std::map<ValueId, Layout>& given, const std::map<ValueId, Layout>& deliver,
                         const Inputs& in, const StepState& state, int steps, const StepTolerances& tolerances,
                         const std::string& what, StepErrors* errors = nullptr, bool async_tp = false) {
  sharding::MeshGroups groups(mesh, pg.shared_from_this());
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  const spmd::Sharding s = spmd::propagate(g, planner, given, deliver);
  if (std::getenv("MT_DUMP") && pg.rank() == 0) fmt::print("{}\n", spmd::to_text(g, s));
  spmd::LoweredGraph lowered = spmd::lower(g, s, planner, pg.rank());
  if (async_tp) {
    EXPECT_TRUE(sched::async_tp(lowered.graph, {mesh.ndim(), mesh.dim_index("tp"), pg.rank()}))
        << what << ": async_tp rewrote nothing";
  }
  sched::lowered_step_pipeline().run(lowered.graph);  // waits sunk, as the trainer runs it
  const Graph& local = lowered.graph;
  runtime::Executor ex(local, sched::make_schedule(local, local.outputs()), &groups);
  for (const auto& [v, t] : in.values)
    ex.bind(lowered.values.at(v), local_piece(t, s.values.at(v), mesh, groups.coordinate()));
  const std::map<ValueId, ValueId> buffer_of(state.write_backs.begin(), state.write_backs.end());
  Inputs single = in;
  StepErrors worst;
  int compared = 0;
  for (int step = 1; step <= steps; ++step) {
    const std::vector<Tensor> want = run_single(g, single);
    ex.run();
    std::vector<Tensor> got;
    compared = 0;
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      const ValueId v = g.outputs()[k];
      got.push_back(ex.fetch(local.outputs()[k]).clone());
      const Tensor expect = local_piece(want[k], s.outputs.at(v), mesh, groups.coordinate());
      EXPECT_EQ(got.back().shape(), expect.shape()) << g.describe_value(v);
      if (got.back().shape() != expect.shape()) continue;
      const auto buffer = buffer_of.find(v);
      const bool scalar = buffer == buffer_of.end();
      const bool parameter = !scalar && g.value(buffer->second).kind == ValueKind::parameter;
      double& kind_worst = scalar ? worst.scalars : parameter ? worst.parameters : worst.moments;
      const double tolerance = scalar ? tolerances.scalars : parameter ? tolerances.parameters : tolerances.moments;
      const std::string name = scalar ? g.describe_value(v) : g.value(buffer->second).name;
      kind_worst = std::max(kind_worst,
                            expect_close(got.back(), expect, tolerance,
                                         fmt::format("{} after step {} on rank {}, {}", name, step, pg.rank(), what)));
      ++compared;
    }
    if (step == steps) break;
    // The next step from this rank's own state (each update is delivered in its buffer's layout).
    for (size_t k = 0; k < g.outputs().size(); ++k)
      if (const auto buffer = buffer_of.find(g.outputs()[k]); buffer != buffer_of.end()) {
        EXPECT_EQ(s.outputs.at(buffer->first), s.values.at(buffer->second))
            << g.describe_value(buffer->first) << " is delivered in another layout than its buffer's";
        ex.bind(lowered.values.at(buffer->second), got[k]);
      }
    single = next_inputs(g, single, want, state);
    ex.bind(lowered.values.at(state.step), single.values.at(state.step).clone());
  }
  if (errors) *errors = worst;
  return compared;
}

// Every rank's largest errors: rank 0 prints the largest of all (and records them as a test property).
inline void report_errors(comm::ProcessGroup& pg, const std::string& what, const StepErrors& errors) {
  Tensor all = Tensor::zeros({3}, DType::f64);
  all.set(0, errors.scalars);
  all.set(1, errors.parameters);
  all.set(2, errors.moments);
  pg.all_reduce(all, comm::ReduceOp::max)->wait();
  if (pg.rank() != 0) return;
  fmt::print(
      "{}: largest relative errors to the single-rank run: loss and grad_norm {:.2e}, parameters {:.2e}, m and v "
      "{:.2e}\n",
      what, all.get(0), all.get(1), all.get(2));
  std::string key = what;
  std::replace_if(
      key.begin(), key.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  ::testing::Test::RecordProperty(key, fmt::format("{:.2e} {:.2e} {:.2e}", all.get(0), all.get(1), all.get(2)));
}

// The tolerances of the steps below, from the largest errors measured over
// every layout these steps are checked on (local backend and mpirun with 2,
// 3 and 4 ranks, shared memory and TCP), on an AVX-512 CPU and on an
// AVX2-only one (QEMU -cpu Haswell: oneDNN's AVX2 GEMMs and the x86-64-v3
// clones of the row kernels sum in other orders), with a margin below 10x:
// - MLP: loss bitwise everywhere (0), held to 2.4e-7 (2^-22: 2 to 4 f32 ulps) as each
//   rank's partial sum is rounded before the all-reduce; parameters 7.7e-8,
//   held to 5e-7 (6.5x); m and v 4.8e-7, held to 4e-6 (8.3x).
// - Llama: loss and grad_norm 1.8e-7, held to 1e-6 (5.5x); parameters
//   6.5e-6 (TP 4: AdamW's first step turns a gradient of ~1e-7, which
//   rounding in the sums of its terms moves by ~1e-3 of itself, into a move
//   of about lr), held to 5e-5 (7.7x); m and v 3.6e-6, held to 3e-5 (8.4x).
inline constexpr StepTolerances kMlpStep{.scalars = 2.4e-7, .parameters = 5e-7, .moments = 4e-6};
inline constexpr StepTolerances kLlamaStep{.scalars = 1e-6, .parameters = 5e-5, .moments = 3e-5};

// The MLP step laid out with `param_layout` on a 1-d mesh of every rank of `pg`.
inline int check_lowered_step(comm::ProcessGroup& pg, const std::string& param_layout) {
  Mlp mlp;
  const Inputs in = make_inputs(mlp.g);
  const Mlp::Layouts l = mlp.layouts(param_layout);
  StepState state;
  const std::vector<ValueId> buffers = {mlp.w1, mlp.states[0], mlp.states[1], mlp.w2, mlp.states[2], mlp.states[3]};
  for (size_t i = 0; i < buffers.size(); ++i) state.write_backs.emplace_back(mlp.updates[i], buffers[i]);
  for (const auto& [v, t] : in.values)
    if (mlp.g.value(v).name == "step") state.step = v;
  StepErrors errors;
  const int compared = check_lowered(pg, sharding::DeviceMesh({pg.size()}), mlp.g, l.given, l.deliver, in, state, 2,
                                     kMlpStep, "parameters " + param_layout, &errors);
  report_errors(pg, fmt::format("MLP step, parameters {} on {} ranks", param_layout, pg.size()), errors);
  return compared;
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

// The tiny Llama's step for a global batch of 4 sequences of 5 tokens (8
// under context parallelism, in its load-balanced chunks, and async TP,
// whose chunks are even), and its layouts under `parallel`.
struct TinyLlamaStep {
  Graph g;
  compile::TrainStepGraph step;
  sharding::DeviceMesh mesh;
  parallel::StepLayouts layouts;
  TinyLlamaStep(const parallel::ParallelConfig& parallel, int ranks, int64_t micro_batches = 1,
                const models::Fp8Linears& fp8 = {})
      : mesh(parallel::make_mesh(parallel, ranks)) {
    config::OptimizerConfig opt = config::TrainConfig().optimizer;
    opt.lr = 1e-2;
    models::LlamaConfig model = tiny_llama();
    model.fp8 = fp8;
    if (parallel.cp > 1) {
      model.seq_chunks = 2 * parallel.cp;
      model.ring_attention = parallel.cp_attention == parallel::ParallelConfig::CpAttention::ring;
    }
    step = compile::build_train_step(g, model, 4, parallel.cp > 1 || parallel.async_tp ? 8 : 5, opt,
                                     {.max_grad_norm = 0.5,
                                      .split_loss = parallel.loss_parallel,
                                      .micro_batches = micro_batches});  // clipping active
    sched::step_pipeline().run(g);
    layouts = parallel::step_layouts(mesh, g, compile::step_roles(step, mesh.size(mesh.dim_index("tp")) > 1), parallel);
  }
};

// `fp8`: the blocks' linear layers in FP8, held to `tolerances`.
inline int check_llama_step(comm::ProcessGroup& pg, const parallel::ParallelConfig& parallel, int64_t micro_batches = 1,
                            const models::Fp8Linears& fp8 = {}, const StepTolerances& tolerances = kLlamaStep) {
  const models::LlamaConfig c = tiny_llama();
  TinyLlamaStep tiny(parallel, pg.size(), micro_batches, fp8);
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
  StepState state{step.write_backs, step.step};
  StepErrors errors;
  const std::string what = fmt::format("Llama step on mesh {}", tiny.mesh.describe());
  const int compared = check_lowered(pg, tiny.mesh, g, tiny.layouts.given, tiny.layouts.deliver, in, state, 2,
                                     tolerances, what, &errors, parallel.async_tp);
  report_errors(pg, what + fmt::format(", {} microbatches", micro_batches), errors);
  return compared;
}

// Parallel configs by name, for tests.
inline parallel::ParallelConfig fsdp() { return {}; }
inline parallel::ParallelConfig ddp(int64_t ranks) { return {.dp_replicate = ranks, .dp_shard = 1}; }
inline parallel::ParallelConfig tp(int64_t tp) { return {.tp = tp}; }

}  // namespace mtest
