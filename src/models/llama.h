// The Hugging Face Llama architecture as a graph: token embedding, per layer
// RMSNorm -> grouped-query attention with rotary embeddings -> residual ->
// RMSNorm -> SwiGLU MLP -> residual, final RMSNorm, LM head (tied or not).
// Parameters carry the Hugging Face names.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "models/parameters.h"

namespace meshtrain::models {

// FP8 training of the blocks' linear layers (training.fp8 tensorwise; torchao's
// Float8 with tensorwise scaling, TransformerEngine's current scaling): each
// GEMM's operands quantised with the scale of their own current amax,
// weights and activations to `format`, output gradients to `grad_format`.
// Not the embedding, the LM head or a MoE router; nor, for now, the routed
// experts' grouped GEMMs.
struct Fp8Linears {
  bool enabled = false;
  DType format = DType::f8e4m3;
  DType grad_format = DType::f8e5m2;  // hybrid; f8e4m3 for the e4m3 recipe
  bool pow2_scale = false;            // scales rounded down to powers of two
  // Each weight quantised before FSDP gathers it (fp8_quantize on its
  // shard, with the whole weight's scale): half the bytes of bf16.
  bool all_gather = false;
  // A linear layer whose name (its weight's, less ".weight") holds one of
  // these is left in the compute dtype (torchtitan's filter_fqns).
  std::vector<std::string> skip;
  // Whether the block linear of this weight runs in FP8.
  bool applies_to(const std::string& weight) const;
};

struct LlamaConfig {
  static constexpr int64_t kMaxLayers = 4096;  // the graph is built layer by layer: a bound on its size
  int64_t dim = 256;
  int64_t n_layers = 6;
  int64_t n_heads = 16;
  int64_t n_kv_heads = 16;
  int64_t ffn_dim = 768;
  int64_t vocab_size = 256;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  // Mixture of experts, Hugging Face Mixtral's sparse block (0 experts: every
  // layer dense). The first `first_dense_layers` layers keep the dense MLP
  // (as DeepSeek's); `n_shared_experts` x moe_ffn_dim wide SwiGLU every token
  // also takes, added unweighted; the load-balancing loss (Switch
  // Transformer's) over every MoE layer, times its coefficient, is added to
  // the loss; capacity_factor > 0 drops the slots over each expert's
  // capacity per sequence (0: dropless).
  int64_t n_experts = 0;
  int64_t n_experts_per_token = 2;
  int64_t moe_ffn_dim = 0;  // 0: ffn_dim
  int64_t first_dense_layers = 0;
  int64_t n_shared_experts = 0;
  double router_aux_loss_coef = 0;
  double capacity_factor = 0;
  // Not a [model] key: expert parallelism's degree (parallel.ep), which
  // builds each MoE layer's expert rows dispatched into this many blocks of
  // experts (the same numbers; 1: not dispatched).
  int64_t dispatch_blocks = 1;
  // Not a [model] key: 2 x context parallelism's degree (parallel.cp) when
  // it is over 1: the sequence then runs in that many load-balanced chunks
  // (graph/sequence_order.h); 1: in position order.
  int64_t seq_chunks = 1;
  // Not a [model] key: with seq_chunks > 1, attention takes its keys and
  // values in the load-balanced order, split as the queries are, for
  // context parallelism's ring (parallel.cp_attention ring); false: in
  // position order, whole (all-gathered).
  bool ring_attention = false;
  // Not a [model] key: training.fp8 and its keys.
  Fp8Linears fp8;
  void validate() const;  // throws naming the inconsistent keys
  int64_t head_dim() const { return dim / n_heads; }
  bool is_moe_layer(int64_t layer) const { return n_experts > 0 && layer >= first_dense_layers; }
  int64_t moe_layers() const { return n_experts > 0 ? std::max<int64_t>(n_layers - first_dense_layers, 0) : 0; }
  // Whether the loss adds the load-balancing loss over the MoE layers' routers.
  bool has_load_balancing_loss() const { return moe_layers() > 0 && router_aux_loss_coef > 0; }
  int64_t expert_ffn_dim() const { return moe_ffn_dim > 0 ? moe_ffn_dim : ffn_dim; }
};

struct LlamaGraph {
  graph::ValueId tokens;                         // i64 [B, T]
  graph::ValueId targets;                        // i64 [B, T]; -100 is ignored
  graph::ValueId loss;                           // mean cross-entropy
  std::map<std::string, graph::ValueId> params;  // Hugging Face name -> parameter value
  // The residual stream [B, T, D]: the embedding's output and each block's
  // sum after attention and after the MLP (what a parallel plan lays out
  // between blocks).
  std::vector<graph::ValueId> residual;
  // The RMSNorm outputs [B, T, D] that feed attention, the MLP and the LM head.
  std::vector<graph::ValueId> normed;
  std::vector<graph::ValueId> logits;  // [B * T, vocab] ([B, T, vocab] with seq_chunks > 1), what the loss reads
  // With seq_chunks > 1, each layer's keys and values [B, T, Hkv, hd] in
  // position order: what context parallelism holds whole on every cp rank.
  std::vector<graph::ValueId> attention_keys;
  // Each use of a parameter in the compute dtype, when it differs from the
  // parameters': (the copy, the parameter).
  std::vector<std::pair<graph::ValueId, graph::ValueId>> param_copies;
  // A span without the head: the residual stream [B, T, D] it hands on (loss is none).
  graph::ValueId output;
  // With a load-balancing loss (router_aux_loss_coef > 0): the router
  // statistics [2, n_experts] (router_stats_dtype) of the MoE layers so far,
  // from the first (those given to the span, plus its own): each expert's
  // top-k picks, then its probabilities' sum over the tokens. A span without
  // the head hands them on; the head forms the loss of them. The
  // load-balancing loss (unweighted, Hugging Face's load_balancing_loss_func;
  // none without MoE layers or a coefficient) and the cross-entropy the loss
  // adds it to.
  graph::ValueId router_stats;
  graph::ValueId aux_loss, ce_loss;
  // Each MoE layer's load: f32 [n_experts + 1], the token slots each expert
  // took, then those dropped over capacity (summed over the batch's rows).
  std::vector<graph::ValueId> expert_load;
  // With dispatch_blocks > 1, each MoE layer's rows dispatched by block of
  // experts [blocks, B, T k, D] into the experts and out of them, each with
  // its experts [blocks, B, T k] (padded with n_experts), and those experts:
  // what expert parallelism lays out by block.
  std::vector<std::pair<graph::ValueId, graph::ValueId>> dispatched_rows;
  std::vector<graph::ValueId> dispatched_experts;
};

// The part of the model one pipeline stage runs: the token embedding (the
// first stage), blocks [first_layer, end_layer), and the final norm, LM head
// and loss (the last stage).
struct LlamaSpan {
  bool embedding = true;
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // -1: n_layers
  bool head = true;
  bool operator==(const LlamaSpan&) const = default;
};
// Whether the parameter of this Hugging Face name belongs to the span.
bool span_holds(const LlamaConfig& config, const LlamaSpan& span, const std::string& parameter);
// With a load-balancing loss, the router statistics of the MoE layers
// before a span are its input (it takes them), and a span without the head
// that holds or follows an MoE layer hands them on (it gives them).
bool span_takes_router_stats(const LlamaConfig& config, const LlamaSpan& span);
bool span_gives_router_stats(const LlamaConfig& config, const LlamaSpan& span);
// The router statistics' dtype: f32, or f64 in an f64 graph (the router's softmax).
DType router_stats_dtype(DType compute_dtype);

// Forward graph for batches of B sequences of T tokens. Parameters are
// `dtype` (f32/f64); compute_dtype defaults to it; with bf16 every use of a parameter is a
// bf16 copy (so its gradient arrives in `dtype`, accumulated there) and the
// activations are bf16; the loss stays f32. Nodes are scoped like
// torchtitan's modules: "tok_embeddings", "layers.<i>.attention_norm",
// "layers.<i>.attention", "layers.<i>.ffn_norm", "layers.<i>.feed_forward",
// "norm", "output", "loss".
// `split_loss`: the loss as Builder::cross_entropy_split (parts that each sum
// over the vocabulary, for logits split by vocabulary) instead of the fused
// cross_entropy; the same number.
LlamaGraph build_llama(graph::Graph& g, const LlamaConfig& config, int64_t batch, int64_t seq_len,
                       DType dtype = DType::f32, std::optional<DType> compute_dtype = std::nullopt,
                       bool split_loss = false);

// build_llama's parts: every parameter as a graph parameter of `dtype`, by
// name; and the forward of a batch given as values (tokens and
// targets [batch, seq]) on those parameters. `count`: the number of valid
// targets the loss's mean is over (none: these targets'), so that the losses
// of microbatches of one batch add up to the batch's mean; `aux_weight`: the
// load-balancing loss's share (1 / the microbatches: each microbatch's loss
// is over its own tokens, and the batch's is their mean).
std::map<std::string, graph::ValueId> add_llama_parameters(graph::Graph& g, const LlamaConfig& config, DType dtype);
LlamaGraph llama_forward(graph::Graph& g, const LlamaConfig& config,
                         const std::map<std::string, graph::ValueId>& params, graph::ValueId tokens,
                         graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss,
                         double aux_weight = 1.0);
// The forward of `span` only: `input` is the tokens [batch, seq] when the
// span has the embedding, else the residual stream [batch, seq, dim] in the
// compute dtype; `targets` and `count` are read only by the head. `params`
// needs only the span's parameters. `router_stats`: the router statistics of
// the layers before the span, given exactly when it takes them
// (span_takes_router_stats).
LlamaGraph llama_span_forward(graph::Graph& g, const LlamaConfig& config, const LlamaSpan& span,
                              const std::map<std::string, graph::ValueId>& params, graph::ValueId input,
                              graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss,
                              double aux_weight = 1.0, graph::ValueId router_stats = {});

// "Llama dim 256 x 6 layers, 16 heads (16 kv), ffn 768, vocab 256", with
// ", 8 experts (top 2, ffn 32, 1 shared) in layers 1-5" for a mixture of
// experts (and no dense ffn where every layer is one).
std::string describe(const LlamaConfig& config);

// Every parameter by name: its shape, and Hugging Face Llama's
// initialisation (normal(0, initializer_range 0.02) for weights, ones for the
// RMSNorm scales). The names are Hugging Face's but for each MoE layer's
// experts, held stacked as one [n_experts, ...] tensor per projection
// (`...block_sparse_moe.experts.w1.weight`), so that expert parallelism
// shards them on their first dim; hf_tensors and from_hf_tensors convert.
std::map<std::string, ParameterSpec> llama_parameters(const LlamaConfig& config);

// Tensors by meshtrain's names to Hugging Face's (each stacked expert
// tensor split into `experts.{e}.w1.weight`, ...), and back: from_hf_tensors
// stacks each expert tensor into the shapes `specs` hold and fails naming
// what is missing or misshapen. Other names pass through.
std::map<std::string, Tensor> hf_tensors(std::map<std::string, Tensor> tensors);
std::map<std::string, Tensor> from_hf_tensors(std::map<std::string, Tensor> tensors,
                                              const std::map<std::string, ParameterSpec>& specs);

// The block layer a parameter belongs to ("model.layers.{i}.…" -> i), if any.
std::optional<int64_t> parameter_layer(std::string_view name);

// Why the layer tensor `name` is missing from a Hugging Face file, where the
// file's tensors of that layer tell: the layer is a mixture of experts where
// the model has a dense MLP or the reverse, it has no shared experts, or
// fewer experts. "; " and the reason, or "" (to append to the error).
std::string missing_tensor_hint(const std::string& name, const std::map<std::string, Tensor>& tensors);

}  // namespace meshtrain::models
