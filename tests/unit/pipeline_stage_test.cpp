// Pipeline stages: how the model's layers fall into stages, how a stage's
// step is cut into forward, input-gradient and weight-gradient programs, and
// the pipeline's steps on ranks of the local backend against one rank
// accumulating the same microbatches.
#include "compile/pipeline_stage.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <set>

#include "comm/local_backend.h"
#include "graph/builder.h"
#include "graph/extract.h"
#include "graph/op_registry.h"
#include "test_util.h"
#include "train/pipeline_runner.h"
#include "train/trainer.h"

using namespace meshtrain;
using mtest::contains;
using mtest::message_of;

namespace {

std::string describe(const std::vector<models::LlamaSpan>& spans) {
  std::string out;
  for (const auto& s : spans)
    out += fmt::format("[{}{}-{}{}]", s.embedding ? "E" : "", s.first_layer, s.end_layer, s.head ? "H" : "");
  return out;
}

config::TrainConfig small_config(int64_t layers) {
  config::TrainConfig c;
  c.model = {.dim = 32, .n_layers = layers, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64, .vocab_size = 256};
  c.data.path = std::string(MESHTRAIN_SOURCE_DIR) + "/data/corpus.txt";
  c.data.batch_size = 4;
  c.data.seq_len = 16;
  c.training.steps = 3;
  c.lr_scheduler.warmup_steps = 0;
  c.optimizer.lr = 1e-2;
  c.training.max_grad_norm = 0.5;  // active: the norm is over every stage
  return c;
}

// One rank accumulating the pipeline's microbatches: the reference the
// pipeline's steps must reproduce.
struct OneRankRun {
  std::unique_ptr<train::Trainer> trainer;
  std::vector<train::StepMetrics> steps;
};

OneRankRun one_rank_run(int64_t microbatches, int steps = 3) {
  config::TrainConfig one = small_config(2);
  one.training.grad_accum_steps = microbatches;
  OneRankRun run{std::make_unique<train::Trainer>(one), {}};
  for (int s = 0; s < steps; ++s) run.steps.push_back(run.trainer->step());
  return run;
}

}  // namespace

TEST(PipelineSpans, TheEmbeddingAndTheHeadCountAsALayerEach) {
  models::LlamaConfig m;
  m.n_layers = 6;
  EXPECT_EQ(describe(compile::pipeline_spans(m, 4, {})), "[E0-1][1-3][3-5][5-6H]");
  EXPECT_EQ(describe(compile::pipeline_spans(m, 8, {})), "[E0-0][0-1][1-2][2-3][3-4][4-5][5-6][6-6H]");
  EXPECT_EQ(describe(compile::pipeline_spans(m, 3, {})), "[E0-2][2-5][5-6H]");  // 8 units: 3, 3, 2
  EXPECT_EQ(describe(compile::pipeline_spans(m, 1, {})), "[E0-6H]");
  m.n_layers = 2;  // 4 units over 3 stages: the first stage takes the one left over
  EXPECT_EQ(describe(compile::pipeline_spans(m, 3, {})), "[E0-1][1-2][2-2H]");
  EXPECT_EQ(describe(compile::pipeline_spans(m, 2, {1, 3})), "[E0-0][0-2H]");
  EXPECT_EQ(describe(compile::pipeline_spans(m, 2, {3, 1})), "[E0-2][2-2H]");
  EXPECT_TRUE(contains(message_of([&] {
                         compile::pipeline_spans(m, 2, {2, 1});
                       }),
                       "parallel.pp_layers_per_stage [2, 1] adds up to 3, but the model has 4 units"));
  EXPECT_TRUE(contains(message_of([&] {
                         compile::pipeline_spans(m, 2, {1, 1, 2});
                       }),
                       "parallel.pp_layers_per_stage lists 3 stages ([1, 1, 2]) but the pipeline has 2"));
  EXPECT_TRUE(contains(message_of([&] { compile::pipeline_spans(m, 5, {}); }), "fewer than the 5 pipeline stages"));
}

TEST(PipelineStage, ZeroBubbleLeavesTheWeightGradientMatmulsToTheWeightHalf) {
  const config::TrainConfig c = small_config(2);
  const auto spans = compile::pipeline_spans(c.model, 2, {});
  const compile::PipelineStage last = compile::build_pipeline_stage(c, spans, 1, 2);
  // The forward program computes no gradient; the backward reads what forward kept.
  for (const graph::NodeId n : last.forward.graph.order())
    EXPECT_EQ(last.forward.graph.node(n).phase, graph::Phase::forward);
  EXPECT_EQ(last.forward.outputs.front(), last.output);
  // The input half ends in the gradient sent back; the weight half computes
  // every linear weight's gradient, each a rows_matmul, and nothing the input half needs.
  ASSERT_TRUE(last.input_gradient.valid());
  EXPECT_EQ(last.backward_input.outputs.front(), last.input_gradient);
  std::set<std::string> weight_ops;
  for (const graph::NodeId n : last.backward_weight.graph.order())
    weight_ops.insert(last.backward_weight.graph.node(n).op->name);
  EXPECT_TRUE(weight_ops.contains("rows_matmul"));
  int linear_weights = 0;
  for (size_t i = 0; i < last.parameter_names.size(); ++i) {
    if (last.joint.value(last.parameters[i]).info.shape.rank() != 2) continue;
    ++linear_weights;
    EXPECT_NE(std::find(last.backward_weight.outputs.begin(), last.backward_weight.outputs.end(), last.gradients[i]),
              last.backward_weight.outputs.end())
        << last.parameter_names[i] << "'s gradient is not in the weight half";
  }
  EXPECT_EQ(linear_weights, 8);  // layer 1's seven and lm_head
  for (const graph::ValueId v : last.backward_weight.outputs)
    EXPECT_EQ(std::find(last.backward_input.reads.begin(), last.backward_input.reads.end(), v),
              last.backward_input.reads.end());
  // The whole backward computes the same values as the two halves.
  EXPECT_EQ(last.backward.graph.num_nodes(),
            last.backward_input.graph.num_nodes() + last.backward_weight.graph.num_nodes());
  // The first stage sends nothing back: it has no input half.
  const compile::PipelineStage first = compile::build_pipeline_stage(c, spans, 0, 2);
  EXPECT_FALSE(first.input_gradient.valid());
  EXPECT_EQ(first.backward_input.graph.num_nodes(), 0u);
}

TEST(ExtractGraph, APartReadsWhatItDoesNotComputeAsInputs) {
  graph::Graph g;
  graph::Builder b(g);
  const auto x = g.add_input("x", {2, 3}, DType::f32);
  const auto w = g.add_parameter("w", {3, 3}, DType::f32);
  const auto y = b.matmul(x, w, false, false);
  const auto z = b.silu(y);
  const auto part = graph::extract_graph(g, {g.value(z).producer}, {z});
  EXPECT_EQ(part.reads, std::vector<graph::ValueId>{y});
  EXPECT_EQ(part.graph.num_nodes(), 1u);
  EXPECT_EQ(part.graph.value(part.values.at(y)).name, fmt::format("%{}", y.index));
  EXPECT_EQ(graph::nodes_needed_for(g, {z}, g.order()).size(), 2u);
  EXPECT_EQ(graph::nodes_needed_for(g, {z}, {g.value(z).producer}).size(), 1u);
  EXPECT_TRUE(contains(message_of([&] { graph::extract_graph(g, {g.value(z).producer}, {x}); }),
                       "is neither computed nor read by the part"));
}

// Each schedule on 2 ranks (threads of the local backend) against one rank
// accumulating the same 4 microbatches: every step's loss and gradient norm,
// and the weights after, bitwise.
TEST(PipelineRunner, EverySchedulesStepsAreOneRanksBitwise) {
  const OneRankRun reference = one_rank_run(4);
  const std::vector<train::StepMetrics>& expected = reference.steps;
  for (const auto kind : {parallel::PpScheduleKind::gpipe, parallel::PpScheduleKind::one_f_one_b,
                          parallel::PpScheduleKind::interleaved_1f1b, parallel::PpScheduleKind::zero_bubble,
                          parallel::PpScheduleKind::zbv}) {
    config::TrainConfig c = small_config(2);
    c.parallel.pp = 2;
    c.parallel.pp_schedule = kind;
    c.parallel.pp_microbatches = 4;
    comm::LocalWorld world(2);
    std::mutex mu;
    world.run([&](comm::ProcessGroup& g) {
      train::Trainer trainer(c, world.group(g.rank()));
      for (int s = 0; s < 3; ++s) {
        const train::StepMetrics m = trainer.step();
        EXPECT_EQ(m.loss, expected[static_cast<size_t>(s)].loss)
            << parallel::pp_schedule_name(kind) << " step " << s + 1;
        EXPECT_EQ(m.grad_norm, expected[static_cast<size_t>(s)].grad_norm) << parallel::pp_schedule_name(kind);
      }
      std::lock_guard lock(mu);
      for (const auto& [name, t] : trainer.parameters()) {
        const Tensor& want = reference.trainer->parameters().at(name);
        ASSERT_EQ(t.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(t.raw(), want.raw(), t.nbytes()), 0) << name << " " << parallel::pp_schedule_name(kind);
      }
    });
  }
}

// PP 2 x TP 2 and PP 2 x FSDP 2 on 4 local-backend ranks (each stage laid
// out on its two ranks; zero-bubble's input and weight halves with their
// collectives; FSDP's UNSHARD and REDUCE_GRAD) against one rank
// accumulating the same microbatches: within 1e-5.
TEST(PipelineRunner, ComposedWithTensorParallelOrFsdpMatchesOneRank) {
  const std::vector<train::StepMetrics> expected = one_rank_run(2).steps;
  for (const int64_t tp : {2, 1}) {
    config::TrainConfig c = small_config(2);
    c.parallel.pp = 2;
    c.parallel.tp = tp;
    c.parallel.dp_shard = 2 / tp;
    c.parallel.pp_schedule = parallel::PpScheduleKind::zero_bubble;
    c.parallel.pp_microbatches = 2 / c.parallel.dp_shard;  // 4 sequences: each microbatch's split over dp_shard
    comm::LocalWorld world(4);
    world.run([&](comm::ProcessGroup& g) {
      train::Trainer trainer(c, world.group(g.rank()));
      for (int s = 0; s < 3; ++s) {
        const train::StepMetrics m = trainer.step();
        const train::StepMetrics& want = expected[static_cast<size_t>(s)];
        EXPECT_NEAR(m.loss, want.loss, 1e-5 * want.loss) << "tp " << tp << " step " << s + 1;
        EXPECT_NEAR(m.grad_norm, want.grad_norm, 1e-5 * want.grad_norm) << "tp " << tp << " step " << s + 1;
      }
    });
  }
}

namespace {

// A mixture of experts (4 experts, top 2, after one dense layer) with a
// load-balancing loss strong enough to move the router.
config::TrainConfig moe_config() {
  config::TrainConfig c = small_config(3);
  c.model.n_experts = 4;
  c.model.n_experts_per_token = 2;
  c.model.moe_ffn_dim = 16;
  c.model.first_dense_layers = 1;
  c.model.router_aux_loss_coef = 0.1;
  return c;
}

}  // namespace

// The load-balancing loss over MoE layers on several stages: the router
// statistics handed on from stage to stage and their gradient sent back
// (1F1B; interleaved, with a stage that starts them after one that has
// none and stages handing over in memory; zero bubble's input and weight
// halves), and PP 2 x EP 2, against one rank accumulating the same
// microbatches: every step's loss, load-balancing loss and gradient norm.
// On one rank per stage the loss and the norm are the single rank's
// bitwise, the load-balancing loss within 1.2e-7 (the step's mean of the
// microbatches', in double here, in f32 there). PP 2 x EP 2 within 2.4e-6
// (measured at step 3; step 1 8.5e-8), as EP 2 without a pipeline is.
TEST(PipelineRunner, LoadBalancingLossOverStagesMatchesOneRank) {
  struct Layout {
    parallel::PpScheduleKind schedule;
    int64_t ep, microbatches;
    double tolerance;  // relative, of the loss and the norm
  };
  using K = parallel::PpScheduleKind;
  for (const Layout l : {Layout{K::one_f_one_b, 1, 4, 0}, Layout{K::interleaved_1f1b, 1, 4, 0},
                         Layout{K::zero_bubble, 1, 4, 0}, Layout{K::one_f_one_b, 2, 2, 5e-6}}) {
    config::TrainConfig one = moe_config();
    one.training.grad_accum_steps = l.microbatches;
    train::Trainer reference(one);
    std::vector<train::StepMetrics> expected;
    for (int s = 0; s < 3; ++s) expected.push_back(reference.step());
    config::TrainConfig c = moe_config();
    c.parallel.pp = 2;
    c.parallel.pp_schedule = l.schedule;
    c.parallel.pp_microbatches = l.microbatches;
    c.parallel.dp_shard = l.ep;
    c.parallel.ep = l.ep;
    comm::LocalWorld world(static_cast<int>(2 * l.ep));
    world.run([&](comm::ProcessGroup& g) {
      train::Trainer trainer(c, world.group(g.rank()));
      for (int s = 0; s < 3; ++s) {
        const train::StepMetrics m = trainer.step();
        const train::StepMetrics& want = expected[static_cast<size_t>(s)];
        const std::string where = fmt::format("{} ep {} step {}", parallel::pp_schedule_name(l.schedule), l.ep, s + 1);
        ASSERT_TRUE(m.aux_loss.has_value() && want.aux_loss.has_value()) << where;
        EXPECT_NEAR(m.loss, want.loss, l.tolerance * want.loss) << where;
        EXPECT_NEAR(m.grad_norm, want.grad_norm, l.tolerance * want.grad_norm) << where;
        EXPECT_NEAR(*m.aux_loss, *want.aux_loss, 2.5e-7 * *want.aux_loss) << where;
      }
    });
  }
}
