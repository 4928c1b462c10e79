// sched::async_tp (sched/passes/async_tp.h): the pass on the text it leaves
// (which chunk each step computes and which rank each ring_shift reaches),
// what it leaves alone, and the rewritten graph run on 4 ranks (threads of
// the local backend) against the graph with its all_gather and
// reduce_scatter. (SpmdExecute.LlamaStepAsyncTensorParallelMatchesOneRank runs whole
// Llama steps so; tests/mpi/async_tp_parity_test.sh trains under mpirun.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "comm/local_backend.h"
#include "comm/reduce.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "runtime/executor.h"
#include "sched/pass.h"
#include "sched/schedule.h"
#include "sharding/device_mesh.h"

using namespace meshtrain;
using namespace meshtrain::graph;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kBatch = 2, kSeq = 8, kDim = 6, kOut = 5;

// A collective over mesh dim 0 of a 1-d mesh of kRanks, started and waited on as lowering emits it.
ValueId collective(Graph& g, const std::string& op, ValueId x, const Shape& out, const std::string& before,
                   const std::string& after, bool reads_input) {
  const graph::ValueInfo& info = g.value(x).info;
  const Attrs attrs{attr::shape(out.dims()),
                    attr::mesh_dims({0}),
                    attr::group({0, 1, 2, 3}),
                    attr::layout_before(before),
                    attr::layout_after(after),
                    attr::global_shape(op == "all_gather" ? out.dims() : info.shape.dims()),
                    attr::buffer_elements(op == "all_gather" ? out.numel() : info.shape.numel()),
                    attr::comm_bytes(static_cast<double>(info.shape.numel() * dtype_size(info.dtype)))};
  std::vector<ValueId> wait_inputs = g.node(g.add_node(op, {x}, attrs)).outputs;
  if (reads_input) wait_inputs.push_back(x);
  return Builder(g).op("wait", wait_inputs);
}

// Sequence parallelism's two patterns: the rows x [B, T/4, D] gathered and
// read by two GEMMs and a rows GEMM (a weight gradient) and by a silu; and
// the sum of two GEMMs' partial sums reduce-scattered back to [B, T/4, N].
struct SpBlock {
  Graph g;
  ValueId x, dy, h1, h2;
};
void build_sp_block(SpBlock& s, DType dtype) {
  Graph& g = s.g;
  Builder b(g);
  s.x = g.add_input("x", {kBatch, kSeq / kRanks, kDim}, dtype);
  s.dy = g.add_input("dy", {kBatch, kSeq, kOut}, dtype);
  s.h1 = g.add_input("h1", {kBatch, kSeq, kDim}, dtype);
  s.h2 = g.add_input("h2", {kBatch, kSeq, kDim}, dtype);
  const ValueId w1 = g.add_parameter("w1", {kOut, kDim}, dtype), w2 = g.add_parameter("w2", {kOut, kDim}, dtype);
  const ValueId gathered = collective(g, "all_gather", s.x, {kBatch, kSeq, kDim}, "S(1)", "R", true);
  g.add_output(b.matmul(gathered, w1, false, true));
  g.add_output(b.matmul(gathered, w2, false, true));
  g.add_output(g.only_output(g.add_node("rows_matmul", {gathered, s.dy})));
  g.add_output(b.silu(gathered));
  const ValueId partial = b.add(b.matmul(s.h1, w1, false, true), b.matmul(s.h2, w2, false, true));
  g.add_output(collective(g, "reduce_scatter", partial, {kBatch, kSeq / kRanks, kOut}, "P(sum)", "S(1)", false));
}

// x [B, T/4, D] of rank 0..3, a weight w [N, D], and x gathered over the 4 ranks.
struct Gathered {
  ValueId x, w, gathered;
};
Gathered gathered_input(Graph& g) {
  Gathered out;
  out.x = g.add_input("x", {kBatch, kSeq / kRanks, kDim}, DType::f32);
  out.w = g.add_parameter("w", {kOut, kDim}, DType::f32);
  out.gathered = collective(g, "all_gather", out.x, {kBatch, kSeq, kDim}, "S(1)", "R", true);
  return out;
}

std::vector<std::string> op_names(const Graph& g) {
  std::vector<std::string> out;
  for (NodeId n : g.order()) {
    const Node& node = g.node(n);
    std::string name = node.op->name;
    if (name == "ring_shift") name += std::to_string(node.attrs.get_or(attr::ring_distance, int64_t{1}));
    // (Appended in two steps: GCC 12 warns on "@" + std::to_string(...) here, -Wrestrict's known false positive.)
    if (name == "slice") name.append("@").append(std::to_string(node.attrs.get(attr::start)));
    out.push_back(name);
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, " ")); }

}  // namespace

// Rank 1 of 4 holds chunk 1. The gather: its own chunk's GEMMs first while
// the rank 1 back's (chunk 0) comes, then chunks 0, 3 and 2 as they arrive
// from 1, 2 and 3 back; each GEMM's chunks concatenated in order, the rows
// GEMM and the silu reading the chunks concatenated. The scatter: the rows
// of chunks 2, 3 and 0 (ranks 1, 2, 3 on) computed and sent, its own chunk
// 1 last, then the four partials of chunk 1 summed in rank order (from rank
// 0, 1 (its own), 2, 3).
TEST(AsyncTp, GemmsRunOnEachChunkWhileTheNextMoves) {
  SpBlock s;
  build_sp_block(s, DType::f32);
  ASSERT_TRUE(sched::async_tp(s.g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = 1}));
  verify(s.g);
  const std::string text = joined(op_names(s.g));
  EXPECT_EQ(text, joined(std::vector<std::string>{
                      "ring_shift1 wait matmul matmul",                      // chunk 1, while chunk 0 comes
                      "ring_shift2 wait matmul matmul",                      // chunk 0, while chunk 3 comes
                      "ring_shift3 wait matmul matmul",                      // chunk 3, while chunk 2 comes
                      "matmul matmul",                                       // chunk 2
                      "concat concat concat rows_matmul silu",               // outputs; the whole x for the rest
                      "slice@4 matmul slice@4 matmul add ring_shift1 wait",  // chunk 2 to rank 2
                      "slice@6 matmul slice@6 matmul add ring_shift2 wait",  // chunk 3 to rank 3
                      "slice@0 matmul slice@0 matmul add ring_shift3 wait",  // chunk 0 to rank 0
                      "slice@2 matmul slice@2 matmul add",                   // its own
                      "add_n",                                               // in rank order
                  }));
  EXPECT_EQ(text.find("all_gather"), std::string::npos);
  EXPECT_EQ(text.find("reduce_scatter"), std::string::npos);
  EXPECT_FALSE(sched::async_tp(s.g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = 1}));  // nothing left
}

// The partials are summed by add_n, which sums as the reduce_scatter's own
// reduction does (comm::reduce_rows): in input order, bf16 in f32 rounded
// once; the same bits, in f32, f64 and bf16.
TEST(AsyncTp, PartialsAreSummedAsTheReduceScatterSums) {
  SpBlock s;
  build_sp_block(s, DType::bf16);
  ASSERT_TRUE(sched::async_tp(s.g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = 0}));
  EXPECT_EQ(op_names(s.g).back(), "add_n");
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Graph g;
    std::vector<ValueId> rows;
    for (int k = 0; k < kRanks; ++k) rows.push_back(g.add_input(fmt::format("row{}", k), {999}, dtype));
    g.add_output(g.only_output(g.add_node("add_n", rows)));
    runtime::Executor ex(g, sched::make_schedule(g, g.outputs()));
    std::mt19937 rng(5);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<Tensor> tensors;
    std::vector<const void*> raw;
    for (int k = 0; k < kRanks; ++k) {
      Tensor t = Tensor::empty({999}, dtype);
      for (int64_t e = 0; e < t.numel(); ++e) t.set(e, normal(rng) * std::pow(10.0, k % 3 * 3));  // 1, 1e3, 1e6
      ex.bind(rows[static_cast<size_t>(k)], t);
      tensors.push_back(t);
      raw.push_back(t.raw());
    }
    ex.run();
    Tensor want = Tensor::empty({999}, dtype);
    comm::reduce_rows(dtype, comm::ReduceOp::sum, raw.data(), kRanks, want.raw(), 999);
    const Tensor got = ex.fetch(g.outputs()[0]);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << dtype_name(dtype);
  }
}

// FP8: the input's amax, which propagation takes of this rank's part of the
// gathered input (shard_locally over tp), is taken of its own chunk, so that
// the scales wait for no gather; then the FP8 GEMM runs chunk by chunk.
TEST(AsyncTp, Fp8InputAmaxReadsTheOwnChunk) {
  Graph g;
  Builder b(g);
  const auto [x, w, gathered] = gathered_input(g);
  const Attrs part_attrs{attr::shape({1, kSeq, kDim}) /* rank 0's row of 2 over 4 */,
                         attr::mesh_dims({0}),
                         attr::group({0, 1, 2, 3}),
                         attr::layout_before("R"),
                         attr::layout_after("S(0)"),
                         attr::global_shape({kBatch, kSeq, kDim}),
                         attr::comm_bytes(0.0)};
  const ValueId part = g.only_output(g.add_node("shard_locally", {gathered}, part_attrs));
  const ValueId amax_x = b.amax(part, "input"), amax_w = b.amax(w, "weight");
  g.add_output(
      b.fp8_matmul(gathered, w, amax_x, amax_w, false, true,
                   {attr::format_a(DType::f8e4m3), attr::format_b(DType::f8e4m3), attr::grad_format(DType::f8e5m2)}));
  ASSERT_TRUE(sched::async_tp(g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = 0}));
  verify(g);
  const std::vector<std::string> o = op_names(g);
  EXPECT_EQ(std::count(o.begin(), o.end(), "fp8_matmul"), kRanks);
  EXPECT_EQ(std::count(o.begin(), o.end(), "shard_locally"), 0);
  EXPECT_EQ(std::count(o.begin(), o.end(), "all_gather"), 0);
  const std::vector<NodeId> readers = g.users(x);
  EXPECT_TRUE(std::any_of(readers.begin(), readers.end(), [&](NodeId n) { return g.node(n).op->name == "amax"; }));
}

// Left alone: a collective over another mesh dim, chunks that are not
// even, a gather no GEMM reads, a gather along the contraction dim, and a
// reduce_scatter of what no GEMM computed.
TEST(AsyncTp, LeavesOtherCollectivesAlone) {
  const auto unchanged = [](const std::function<void(Graph&)>& build, int tp_mesh_dim = 0) {
    Graph g;
    build(g);
    const std::string before = to_text(g);
    EXPECT_FALSE(sched::async_tp(g, {.mesh_ndim = 2, .tp_mesh_dim = tp_mesh_dim, .rank = 0}));
    EXPECT_EQ(to_text(g), before);
  };
  const auto gather = [](Graph& g, const Shape& shard, const Shape& whole, const std::string& before) {
    const ValueId x = g.add_input("x", shard, DType::f32);
    const Attrs attrs{attr::shape(whole.dims()),   attr::mesh_dims({0}),     attr::group({0, 1}),
                      attr::layout_before(before), attr::layout_after("RR"), attr::global_shape(whole.dims()),
                      attr::buffer_elements(0),    attr::comm_bytes(64.0)};
    std::vector<ValueId> wait_inputs = g.node(g.add_node("all_gather", {x}, attrs)).outputs;
    wait_inputs.push_back(x);
    return Builder(g).op("wait", wait_inputs);
  };
  const auto matmul_of = [](Graph& g, ValueId x) {
    const int64_t k = g.value(x).info.shape[2];
    g.add_output(Builder(g).matmul(x, g.add_parameter("w", {3, k}, DType::f32), false, true));
  };
  unchanged([&](Graph& g) { matmul_of(g, gather(g, {2, 4, 6}, {2, 8, 6}, "S(1)R")); }, 1);  // tp is mesh dim 1
  unchanged([&](Graph& g) { matmul_of(g, gather(g, {2, 3, 6}, {2, 5, 6}, "S(1)R")); });     // 5 rows: 3 and 2
  unchanged([&](Graph& g) { g.add_output(Builder(g).silu(gather(g, {2, 4, 6}, {2, 8, 6}, "S(1)R"))); });
  unchanged([&](Graph& g) { matmul_of(g, gather(g, {2, 8, 3}, {2, 8, 6}, "S(2)R")); });  // the contraction dim
  unchanged([&](Graph& g) {  // a batched right operand: its batch would need cutting too
    const ValueId x = gather(g, {2, 4, 6}, {2, 8, 6}, "S(1)R");
    g.add_output(Builder(g).matmul(x, g.add_parameter("w", {2, 3, 6}, DType::f32), false, true));
  });
  unchanged([](Graph& g) {
    const ValueId x = g.add_input("x", {2, 8, 6}, DType::f32);
    const Attrs attrs{attr::shape({2, 4, 6}),         attr::mesh_dims({0}),        attr::group({0, 1}),
                      attr::layout_before("P(sum)R"), attr::layout_after("S(1)R"), attr::global_shape({2, 8, 6}),
                      attr::buffer_elements(0),       attr::comm_bytes(64.0)};
    std::vector<ValueId> wait_inputs = g.node(g.add_node("reduce_scatter", {x}, attrs)).outputs;
    g.add_output(Builder(g).op("wait", wait_inputs));
  });
}

// A gathered value that is also a graph output is delivered whole (the
// chunks concatenated); a GEMM's partial sum that is one is not cut.
TEST(AsyncTp, GraphOutputsStayWhole) {
  Graph g;
  Builder b(g);
  const auto [x, w, gathered] = gathered_input(g);
  g.add_output(gathered);
  const ValueId y = b.matmul(gathered, w, false, true);
  g.add_output(y);
  g.add_output(collective(g, "reduce_scatter", y, {kBatch, kSeq / kRanks, kOut}, "P(sum)", "S(1)", false));
  ASSERT_TRUE(sched::async_tp(g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = 2}));
  verify(g);
  const std::vector<std::string> o = op_names(g);
  EXPECT_EQ(std::count(o.begin(), o.end(), "concat"), 2);  // the GEMM's output and x
  EXPECT_EQ(std::count(o.begin(), o.end(), "reduce_scatter"), 1);
  EXPECT_EQ(std::count(o.begin(), o.end(), "all_gather"), 0);
}

// On 4 ranks, the block with and without the pass, in f32 and bf16 (each
// rank's inputs its own): the gathered values the same bits, the GEMMs'
// within their rounding.
TEST(AsyncTp, SameBitsAsTheCollectivesOnFourRanks) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    comm::GroupOptions options;
    options.timeout = std::chrono::seconds(20);
    comm::LocalWorld world(kRanks, options);
    std::atomic<int> compared{0};
    world.run([&](comm::ProcessGroup& pg) {
      const sharding::DeviceMesh mesh({kRanks}, {"tp"});
      sharding::MeshGroups groups(mesh, pg.shared_from_this());
      SpBlock plain, rewritten;
      build_sp_block(plain, dtype);
      build_sp_block(rewritten, dtype);
      ASSERT_TRUE(sched::async_tp(rewritten.g, {.mesh_ndim = 1, .tp_mesh_dim = 0, .rank = pg.rank()}));
      sched::lowered_step_pipeline().run(rewritten.g);  // waits sunk, as a step runs
      std::mt19937 rng(static_cast<unsigned>(17 + pg.rank()));
      std::normal_distribution<double> normal(0.0, 1.0);
      std::map<std::string, Tensor> inputs;
      for (int i = 0; i < plain.g.num_values(); ++i) {
        const Value& v = plain.g.value(ValueId(i));
        if (v.kind == ValueKind::intermediate) continue;
        Tensor t = Tensor::empty(v.info.shape, v.info.dtype);
        for (int64_t e = 0; e < t.numel(); ++e) t.set(e, normal(rng));
        inputs[v.name] = t;
      }
      std::vector<std::vector<Tensor>> outputs;
      for (SpBlock* s : {&plain, &rewritten}) {
        runtime::Executor ex(s->g, sched::make_schedule(s->g, s->g.outputs()), &groups);
        for (int i = 0; i < s->g.num_values(); ++i)
          if (const Value& v = s->g.value(ValueId(i)); v.kind != ValueKind::intermediate)
            ex.bind(ValueId(i), inputs.at(v.name));
        ex.run();
        outputs.emplace_back();
        for (ValueId out : s->g.outputs()) outputs.back().push_back(ex.fetch(out).clone());
      }
      for (size_t k = 0; k < outputs[0].size(); ++k) {
        const Tensor &want = outputs[0][k], &got = outputs[1][k];
        ASSERT_EQ(got.shape(), want.shape());
        // In f32 the GEMMs run on fewer rows, for which oneDNN may pick other kernels (an ulp or two apart;
        // bf16's rounding covers it here). The rows GEMM and the silu read the very values gathered.
        const double tolerance = k == 2 || k == 3 || dtype == DType::bf16 ? 0.0 : 1e-6;
        for (int64_t e = 0; e < want.numel(); ++e)
          ASSERT_LE(std::fabs(got.get(e) - want.get(e)), tolerance * (1 + std::fabs(want.get(e))))
              << "output " << k << " element " << e << " on rank " << pg.rank() << ": " << got.get(e) << " against "
              << want.get(e);
        ++compared;
      }
    });
    EXPECT_EQ(compared.load(), kRanks * 5);
  }
}
