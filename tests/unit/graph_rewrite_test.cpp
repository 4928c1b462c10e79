// The rewritable graph: its text form (golden text), rewrites (insert
// before, replace uses, remove, reorder) and the invariant checker; scopes
// and phases as the model and autodiff set them.
#include <gtest/gtest.h>

#include <map>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "models/llama.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using mtest::contains;
using mtest::message_of;

namespace {

// y = silu(x @ w^T) in scope "mlp", loss = mean(y).
struct Small {
  Graph g;
  ValueId x, w, h, y, loss;
  Small() {
    Builder b(g);
    x = g.add_input("x", {2, 4}, DType::f32);
    w = g.add_parameter("w", {3, 4}, DType::f32);
    {
      ScopeGuard scope(g, "mlp");
      h = b.matmul(x, w, false, true);
      y = b.silu(h);
    }
    loss = b.mean(y);
    g.add_output(loss);
  }
};

}  // namespace

TEST(GraphText, Golden) {
  Small s;
  EXPECT_EQ(to_text(s.g),
            "input %0:x: f32(2, 4)\n"
            "param %1:w: f32(3, 4)\n"
            "%2: f32(2, 3) = matmul(%0:x, %1:w) {transpose_a=false, transpose_b=true}  # forward mlp\n"
            "%3: f32(2, 3) = silu(%2)  # forward mlp\n"
            "%4: f32() = mean(%3)  # forward\n"
            "outputs %4\n");
}

TEST(GraphText, BackwardNodesCarryTheScopeOfWhatTheyDifferentiate) {
  Small s;
  const auto grads = append_backward(s.g, s.loss, {s.w});
  s.g.add_output(grads[0]);
  // mean's backward: 1 broadcast and scaled by 1/6; then silu's and the
  // matmul's (dx = dh w, dw = dh^T x), in the scope of their forward nodes.
  EXPECT_EQ(to_text(s.g),
            "input %0:x: f32(2, 4)\n"
            "param %1:w: f32(3, 4)\n"
            "%2: f32(2, 3) = matmul(%0:x, %1:w) {transpose_a=false, transpose_b=true}  # forward mlp\n"
            "%3: f32(2, 3) = silu(%2)  # forward mlp\n"
            "%4: f32() = mean(%3)  # forward\n"
            "%5: f32() = full() {dtype=f32, shape=[], value=1}  # backward\n"
            "%6: f32(2, 3) = broadcast_scalar(%5) {shape=[2, 3]}  # backward\n"
            "%7: f32(2, 3) = scale(%6) {alpha=0.16666666666666666}  # backward\n"
            "%8: f32(2, 3) = silu_backward(%2, %7)  # backward mlp\n"
            "%9: f32(2, 4) = matmul(%8, %1:w) {transpose_a=false, transpose_b=false}  # backward mlp\n"
            "%10: f32(3, 4) = matmul(%8, %0:x) {transpose_a=true, transpose_b=false}  # backward mlp\n"
            "outputs %4, %10\n");
}

TEST(GraphRewrite, InsertBeforeAndReplaceUses) {
  Small s;
  Builder b(s.g);
  const NodeId silu = s.g.value(s.y).producer;
  ValueId doubled;
  {
    InsertBefore at(s.g, silu);  // takes the scope and phase of the silu
    doubled = b.scale(s.h, 2.0);
  }
  s.g.replace_uses(s.h, doubled);  // every reader of h but the scale itself
  verify(s.g);
  EXPECT_EQ(to_text(s.g),
            "input %0:x: f32(2, 4)\n"
            "param %1:w: f32(3, 4)\n"
            "%2: f32(2, 3) = matmul(%0:x, %1:w) {transpose_a=false, transpose_b=true}  # forward mlp\n"
            "%5: f32(2, 3) = scale(%2) {alpha=2}  # forward mlp\n"
            "%3: f32(2, 3) = silu(%5)  # forward mlp\n"
            "%4: f32() = mean(%3)  # forward\n"
            "outputs %4\n");
  // Back at the end, in the outer scope, once the InsertBefore is gone.
  const ValueId extra = b.scale(s.loss, 3.0);
  EXPECT_EQ(s.g.order().back(), s.g.value(extra).producer);
  EXPECT_EQ(s.g.node(s.g.value(extra).producer).scope, "");
  EXPECT_TRUE(contains(message_of([&] { s.g.replace_uses(s.h, s.loss); }), "differ in shape or dtype"));
}

TEST(GraphRewrite, RemoveOnlyWhatNothingReads) {
  Small s;
  Builder b(s.g);
  const ValueId unused = b.silu(s.x);
  const NodeId matmul = s.g.value(s.h).producer;
  EXPECT_TRUE(contains(message_of([&] { s.g.remove_node(matmul); }), "is still used (by 1 nodes)"));
  EXPECT_TRUE(contains(message_of([&] { s.g.remove_node(s.g.value(s.loss).producer); }), "and as a graph output"));
  const size_t before = s.g.num_nodes();
  s.g.remove_node(s.g.value(unused).producer);
  EXPECT_EQ(s.g.num_nodes(), before - 1);
  EXPECT_TRUE(s.g.node(s.g.value(unused).producer).removed);  // ids stay valid
  EXPECT_TRUE(contains(message_of([&] { s.g.remove_node(s.g.value(unused).producer); }), "already removed"));
  verify(s.g);
}

TEST(GraphRewrite, ReorderIsCheckedByVerify) {
  Small s;
  const NodeId mm = s.g.value(s.h).producer, silu = s.g.value(s.y).producer, mean = s.g.value(s.loss).producer;
  EXPECT_TRUE(contains(message_of([&] { s.g.set_order({mm, mm, mean}); }), "appears twice"));
  EXPECT_TRUE(contains(message_of([&] { s.g.set_order({mm, silu}); }), "2 nodes given, the graph has 3 live nodes"));
  s.g.set_order({mm, mean, silu});  // a permutation, but mean now reads y before it exists
  EXPECT_TRUE(contains(message_of([&] { verify(s.g); }), "reads silu.1: f32(2, 3) before it is computed"));
  s.g.set_order({mm, silu, mean});
  verify(s.g);
}

TEST(GraphScopes, LlamaNodesAreScopedPerBlock) {
  models::LlamaConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_dim = 24;
  c.vocab_size = 11;
  Graph g;
  const auto m = models::build_llama(g, c, 2, 3);
  std::map<std::string, std::vector<std::string>> ops_by_scope;
  for (NodeId n : g.order()) ops_by_scope[g.node(n).scope].push_back(g.node(n).op->name);
  std::vector<std::string> scopes;
  for (const auto& [scope, ops] : ops_by_scope) scopes.push_back(scope);
  EXPECT_EQ(scopes, (std::vector<std::string>{"layers.0.attention", "layers.0.attention_norm", "layers.0.feed_forward",
                                              "layers.0.ffn_norm", "layers.1.attention", "layers.1.attention_norm",
                                              "layers.1.feed_forward", "layers.1.ffn_norm", "loss", "norm", "output",
                                              "tok_embeddings"}));
  EXPECT_EQ(ops_by_scope["layers.1.feed_forward"],
            (std::vector<std::string>{"matmul", "matmul", "swiglu", "matmul", "add"}));
  EXPECT_EQ(ops_by_scope["layers.0.attention_norm"], (std::vector<std::string>{"rms_norm"}));
  // Backward nodes land in the scope of the forward node they differentiate.
  std::vector<ValueId> params;
  for (const auto& [name, v] : m.params) params.push_back(v);
  append_backward(g, m.loss, params);
  int backward_in_layer1_ffn = 0;
  for (NodeId n : g.order())
    if (g.node(n).phase == Phase::backward && g.node(n).scope == "layers.1.feed_forward") ++backward_in_layer1_ffn;
  EXPECT_GE(backward_in_layer1_ffn, 4);  // swiglu_backward and the matmuls' gradients
  verify(g);
}
