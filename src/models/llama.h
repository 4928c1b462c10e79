// The Hugging Face Llama architecture as a graph: token embedding, per layer
// RMSNorm -> grouped-query attention with rotary embeddings -> residual ->
// RMSNorm -> SwiGLU MLP -> residual, final RMSNorm, LM head (tied or not).
// Parameters carry the Hugging Face names.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "models/parameters.h"

namespace meshtrain::models {

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
  void validate() const;  // throws naming the inconsistent keys
  int64_t head_dim() const { return dim / n_heads; }
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
  std::vector<graph::ValueId> logits;  // [B * T, vocab], what the loss reads
  // Each use of a parameter in the compute dtype, when it differs from the
  // parameters': (the copy, the parameter).
  std::vector<std::pair<graph::ValueId, graph::ValueId>> param_copies;
  // A span without the head: the residual stream [B, T, D] it hands on (loss is none).
  graph::ValueId output;
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
// Hugging Face name; and the forward of a batch given as values (tokens and
// targets [batch, seq]) on those parameters. `count`: the number of valid
// targets the loss's mean is over (none: these targets'), so that the losses
// of microbatches of one batch add up to the batch's mean.
std::map<std::string, graph::ValueId> add_llama_parameters(graph::Graph& g, const LlamaConfig& config, DType dtype);
LlamaGraph llama_forward(graph::Graph& g, const LlamaConfig& config,
                         const std::map<std::string, graph::ValueId>& params, graph::ValueId tokens,
                         graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss);
// The forward of `span` only: `input` is the tokens [batch, seq] when the
// span has the embedding, else the residual stream [batch, seq, dim] in the
// compute dtype; `targets` and `count` are read only by the head. `params`
// needs only the span's parameters.
LlamaGraph llama_span_forward(graph::Graph& g, const LlamaConfig& config, const LlamaSpan& span,
                              const std::map<std::string, graph::ValueId>& params, graph::ValueId input,
                              graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss);

// Every parameter by Hugging Face name: its shape, and Hugging Face Llama's
// initialisation (normal(0, initializer_range 0.02) for weights, ones for the
// RMSNorm scales).
std::map<std::string, ParameterSpec> llama_parameters(const LlamaConfig& config);

}  // namespace meshtrain::models
