// A lowered step runs: on 2 and 3 ranks (threads of the local backend), FSDP
// and DDP layouts of a small MLP training step, each rank's lowered graph run
// for two optimizer steps on its shards of the same global inputs gives the
// single-rank run's loss and its shards of the updated parameters and moments
// at each step (tests/common/spmd_step_checks.h: the tolerances and what they
// were measured at). (tests/mpi runs the same check in processes under mpirun.)
#include <gtest/gtest.h>

#include <atomic>

#include "comm/local_backend.h"
#include "spmd_step_checks.h"
#include "train/trainer.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using sharding::Layout;

namespace {

void check_distributed(int ranks, const std::string& param_layout) {
  SCOPED_TRACE(fmt::format("{} ranks, parameters {}", ranks, param_layout));
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(ranks, options);
  std::atomic<int> compared{0};
  world.run([&](comm::ProcessGroup& pg) { compared += mtest::check_lowered_step(pg, param_layout); });
  EXPECT_EQ(compared.load(), ranks * 7);  // the loss, and w1, m1, v1, w2, m2, v2 updated
}

}  // namespace

TEST(SpmdExecute, FsdpMatchesOneRank) {
  check_distributed(2, "S(0)");
  check_distributed(3, "S(0)");  // uneven shards
}

TEST(SpmdExecute, DdpMatchesOneRank) {
  check_distributed(2, "R");
  check_distributed(3, "R");
}

namespace {

void check_llama(int ranks, const parallel::ParallelConfig& config, int64_t micro_batches = 1,
                 const models::Fp8Linears& fp8 = {}, const mtest::StepTolerances& tolerances = mtest::kLlamaStep) {
  SCOPED_TRACE(
      fmt::format("Llama step, {} ranks, dp_replicate {} dp_shard {} tp {} cp {} ({}) sequence_parallel {} async_tp {}",
                  ranks, config.dp_replicate, config.dp_shard, config.tp, config.cp,
                  config.cp_attention == parallel::ParallelConfig::CpAttention::ring ? "ring" : "allgather",
                  config.sequence_parallel, config.async_tp));
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(30);
  comm::LocalWorld world(ranks, options);
  std::atomic<int> compared{0};
  world.run(
      [&](comm::ProcessGroup& pg) { compared += mtest::check_llama_step(pg, config, micro_batches, fp8, tolerances); });
  EXPECT_EQ(compared.load(), ranks * mtest::kLlamaStepOutputs);
}

}  // namespace

TEST(SpmdExecute, LlamaStepFsdpAndDdpMatchOneRank) {
  check_llama(2, mtest::fsdp());
  check_llama(3, mtest::fsdp());  // uneven: 11 vocab rows, batch 4 over 3
  check_llama(2, mtest::ddp(2));
}

TEST(SpmdExecute, LlamaStepWithGradientAccumulationMatchesOneRank) {
  check_llama(2, mtest::fsdp(), 2);  // each rank's 2 rows in 2 microbatches
  check_llama(4, {.dp_shard = 2, .tp = 2, .sequence_parallel = true, .loss_parallel = true}, 2);
}

TEST(SpmdExecute, LlamaStepTensorParallelMatchesOneRank) {
  check_llama(2, mtest::tp(2));  // 11 vocab rows: 6 and 5
  check_llama(4, mtest::tp(4));
  check_llama(4, {.dp_shard = 2, .tp = 2});  // FSDP 2 x TP 2
  check_llama(4, {.dp_replicate = 2, .dp_shard = 1, .tp = 2});
}

// Context parallelism, the keys and values all-gathered or passed around
// the ring (spmd/ring_attention.h), against the same step whole on one rank.
TEST(SpmdExecute, LlamaStepContextParallelMatchesOneRank) {
  using enum parallel::ParallelConfig::CpAttention;
  check_llama(2, {.cp = 2, .cp_attention = allgather});
  check_llama(2, {.cp = 2, .cp_attention = ring});
  check_llama(4, {.cp = 4, .cp_attention = ring});
  check_llama(4, {.dp_shard = 2, .cp = 2, .cp_attention = ring});
  check_llama(4, {.dp_shard = 1, .tp = 2, .cp = 2, .cp_attention = ring, .sequence_parallel = true});
}

// FP8 linear layers: every layout quantises with the whole tensor's amax
// (sharded amaxes all-reduced by max), so it computes what one rank does.
TEST(SpmdExecute, LlamaStepInFp8MatchesOneRank) {
  const models::Fp8Linears fp8{.enabled = true};
  const mtest::StepTolerances tolerance = mtest::kLlamaStep;
  check_llama(2, mtest::ddp(2), 1, fp8, tolerance);
  check_llama(2, mtest::fsdp(), 1, fp8, tolerance);
  check_llama(4, {.dp_shard = 2, .tp = 2, .sequence_parallel = true}, 1, fp8, tolerance);
  check_llama(4, mtest::tp(4), 1, fp8, tolerance);
  check_llama(2, {.cp = 2, .cp_attention = parallel::ParallelConfig::CpAttention::ring}, 1, fp8, tolerance);
  check_llama(3, mtest::fsdp(), 1, {.enabled = true, .all_gather = true}, tolerance);  // gathered in FP8, uneven
}

TEST(SpmdExecute, LlamaStepSequenceParallelMatchesOneRank) {
  check_llama(2, {.tp = 2, .sequence_parallel = true});  // seq 5 over 2: 3 and 2
  check_llama(4, {.dp_replicate = 2, .dp_shard = 1, .tp = 2, .sequence_parallel = true});
}

// Async TP (sched::async_tp, which check_llama_step requires to rewrite the
// step): sequence 8, in chunks of 4 and 2.
TEST(SpmdExecute, LlamaStepAsyncTensorParallelMatchesOneRank) {
  check_llama(2, {.tp = 2, .sequence_parallel = true, .async_tp = true});
  check_llama(4, {.tp = 4, .sequence_parallel = true, .async_tp = true});
  check_llama(4, {.dp_shard = 2, .tp = 2, .sequence_parallel = true, .async_tp = true, .loss_parallel = true});
  check_llama(4, {.tp = 4, .sequence_parallel = true, .async_tp = true}, 1, {.enabled = true});  // FP8
}

// Loss parallel: on every rank, no value of the lowered step (forward or
// backward) holds a row of the whole vocabulary (the logits, their gradient,
// anything shaped like them); without it, the logits are gathered somewhere.
TEST(SpmdExecute, LossParallelNeverHoldsWholeVocabularyRows) {
  for (const bool loss_parallel : {true, false}) {
    const parallel::ParallelConfig config{
        .dp_replicate = 2, .dp_shard = 1, .tp = 2, .sequence_parallel = true, .loss_parallel = loss_parallel};
    mtest::TinyLlamaStep tiny(config, 4);
    sharding::Planner planner(tiny.mesh, sharding::CostModel::for_mesh(tiny.mesh));
    const spmd::Sharding s = spmd::propagate(tiny.g, planner, tiny.layouts.given, tiny.layouts.deliver);
    const int64_t vocab = mtest::tiny_llama().vocab_size;
    int whole_rows = 0;
    for (int rank = 0; rank < 4; ++rank) {
      const Graph local = spmd::lower(tiny.g, s, planner, rank).graph;
      for (int i = 0; i < local.num_values(); ++i) {
        const Shape& shape = local.value(ValueId(i)).info.shape;
        whole_rows += shape.rank() >= 2 && shape.dim(-1) == vocab;
      }
    }
    if (loss_parallel)
      EXPECT_EQ(whole_rows, 0);
    else
      EXPECT_GT(whole_rows, 0);  // the check can see them
  }
}

TEST(SpmdExecute, LlamaStepLossParallelMatchesOneRank) {
  check_llama(2, {.tp = 2, .loss_parallel = true});  // 11 vocab entries: 6 and 5
  check_llama(4, {.dp_replicate = 2, .dp_shard = 1, .tp = 2, .sequence_parallel = true, .loss_parallel = true});
  check_llama(4, {.dp_shard = 2, .tp = 2, .loss_parallel = true});
}

// DDP's lowered step moves each gradient once (an all_reduce over the
// replicas, into the replicated layout AdamW reads) and nothing else of a
// parameter's size: the clipped gradient is pinned to its parameter's layout,
// so no rank clips a shard of it and gathers it back for the update.
TEST(SpmdExecute, DdpReducesEachGradientOnceAndGathersNothing) {
  mtest::TinyLlamaStep tiny(mtest::ddp(2), 2);
  sharding::Planner planner(tiny.mesh, sharding::CostModel::for_mesh(tiny.mesh));
  const spmd::Sharding s = spmd::propagate(tiny.g, planner, tiny.layouts.given, tiny.layouts.deliver);
  double param_bytes = 0;
  for (const ValueId p : tiny.g.parameters())
    param_bytes += static_cast<double>(tiny.g.value(p).info.shape.numel() * dtype_size(tiny.g.value(p).info.dtype));
  for (int rank = 0; rank < 2; ++rank) {
    const Graph local = spmd::lower(tiny.g, s, planner, rank).graph;
    double reduced_bytes = 0;
    for (const NodeId n : local.order()) {
      const Node& node = local.node(n);
      if (!node.op->is_collective || node.op->name == "shard_locally") continue;
      EXPECT_EQ(node.op->name, "all_reduce") << "rank " << rank << ": " << node.op->name << " in a DDP step";
      if (!node.attrs.get(attr::global_shape).empty()) reduced_bytes += node.attrs.get(attr::comm_bytes);
    }
    EXPECT_EQ(reduced_bytes, param_bytes) << "rank " << rank;
  }
}

// bf16 compute: each gradient is reduced in training.reduce_dtype, f32 by
// default (the bf16 gradient is widened while it is still a pending sum),
// bf16 when asked; under DDP and FSDP alike.
TEST(SpmdExecute, Bf16GradientsAreReducedInTheReduceDtype) {
  for (const char* layout : {"ddp", "fsdp"})
    for (const DType reduce : {DType::f32, DType::bf16}) {
      config::TrainConfig c;
      c.model = mtest::tiny_llama();
      c.data.batch_size = 4;
      c.data.seq_len = 5;
      c.training.dtype = DType::bf16;
      c.training.reduce_dtype = reduce;
      if (std::string(layout) == "ddp") c.parallel = mtest::ddp(2);
      Graph g;
      const compile::TrainStepGraph step = compile::build_step(c, g);
      const compile::StepLayout l = compile::lay_out_step(c, g, step, 2, 0, compile::scheduling_hardware(c));
      const Graph& local = l.lowered.graph;
      int reductions = 0;
      for (const NodeId n : local.order()) {
        const Node& node = local.node(n);
        const bool reduces = node.op->name == "all_reduce" || node.op->name == "reduce_scatter";
        if (!reduces || node.attrs.get(attr::global_shape).size() != 2) continue;  // weights' gradients
        ++reductions;
        EXPECT_EQ(local.value(node.inputs[0]).info.dtype, reduce)
            << layout << ", reduce_dtype " << dtype_name(reduce) << ": " << node.op->name << " of "
            << local.describe_value(node.inputs[0]);
      }
      EXPECT_GT(reductions, 0) << layout;
    }
}

// A ring_shift node (context parallelism's ring) over the second dim of a
// 2 x 3 mesh of 6 ranks: each rank gets the previous rank's tensor in its
// group, wrapping around; a second shift of the first's result, in flight
// with it, brings the tensor of the rank two back. Run twice.
TEST(SpmdExecute, RingShiftPassesToTheNextRankOfTheGroup) {
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(6, options);
  std::atomic<int> checked{0};
  world.run([&](comm::ProcessGroup& pg) {
    const sharding::DeviceMesh mesh({2, 3}, {"dp", "cp"});
    sharding::MeshGroups groups(mesh, pg.shared_from_this());
    const std::vector<int64_t> group = mesh.group_ranks(pg.rank(), {1});
    const int me = mesh.coordinate(pg.rank())[1];
    Graph g;
    Builder b(g);
    const ValueId x = g.add_input("x", Shape{2, 3}, DType::f32);
    const ValueId once = b.ring_shift(x, 1, group), twice = b.ring_shift(once, 1, group);
    g.add_output(once);
    g.add_output(twice);
    runtime::Executor ex(g, sched::make_schedule(g, g.outputs()), &groups);
    Tensor mine = Tensor::empty(Shape{2, 3}, DType::f32);
    for (int64_t e = 0; e < 6; ++e) mine.set(e, 10.0 * pg.rank() + static_cast<double>(e));
    ex.bind(x, mine);
    for (int run = 0; run < 2; ++run) {
      ex.run();
      const int64_t back_one = group[static_cast<size_t>((me + 2) % 3)],
                    back_two = group[static_cast<size_t>((me + 1) % 3)];
      for (int64_t e = 0; e < 6; ++e) {
        EXPECT_EQ(ex.fetch(once).get(e), 10.0 * static_cast<double>(back_one) + static_cast<double>(e));
        EXPECT_EQ(ex.fetch(twice).get(e), 10.0 * static_cast<double>(back_two) + static_cast<double>(e));
      }
    }
    ++checked;
  });
  EXPECT_EQ(checked.load(), 6);
}
