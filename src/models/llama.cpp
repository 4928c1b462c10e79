#include "models/llama.h"

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "graph/builder.h"

namespace meshtrain::models {

void LlamaConfig::validate() const {
  MT_CHECK(dim > 0 && n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && ffn_dim > 0 && vocab_size > 0,
           "model: dim, n_layers, n_heads, n_kv_heads, ffn_dim and vocab_size must be positive");
  MT_CHECK(n_layers <= kMaxLayers,
           "model: n_layers {} is more than {}: the step's graph holds every layer's nodes "
           "(Llama 3.1 405B has 126 layers)",
           n_layers, kMaxLayers);
  MT_CHECK(dim % n_heads == 0, "model: dim {} must be divisible by n_heads {}", dim, n_heads);
  MT_CHECK(n_heads % n_kv_heads == 0, "model: n_heads {} must be a multiple of n_kv_heads {}", n_heads, n_kv_heads);
  MT_CHECK(head_dim() % 2 == 0, "model: head dim {} (dim / n_heads) must be even for rotary embeddings", head_dim());
  MT_CHECK(norm_eps > 0 && rope_theta > 0, "model: norm_eps and rope_theta must be positive");
}

std::map<std::string, ParameterSpec> llama_parameters(const LlamaConfig& c) {
  const ParameterInit weight{ParameterInit::Kind::normal, 0.02}, norm_scale{ParameterInit::Kind::ones};
  std::map<std::string, ParameterSpec> params;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim();
  params["model.embed_tokens.weight"] = {{c.vocab_size, c.dim}, weight};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    params[p + "input_layernorm.weight"] = {{c.dim}, norm_scale};
    params[p + "self_attn.q_proj.weight"] = {{c.dim, c.dim}, weight};
    params[p + "self_attn.k_proj.weight"] = {{kv_dim, c.dim}, weight};
    params[p + "self_attn.v_proj.weight"] = {{kv_dim, c.dim}, weight};
    params[p + "self_attn.o_proj.weight"] = {{c.dim, c.dim}, weight};
    params[p + "post_attention_layernorm.weight"] = {{c.dim}, norm_scale};
    params[p + "mlp.gate_proj.weight"] = {{c.ffn_dim, c.dim}, weight};
    params[p + "mlp.up_proj.weight"] = {{c.ffn_dim, c.dim}, weight};
    params[p + "mlp.down_proj.weight"] = {{c.dim, c.ffn_dim}, weight};
  }
  params["model.norm.weight"] = {{c.dim}, norm_scale};
  if (!c.tie_embeddings) params["lm_head.weight"] = {{c.vocab_size, c.dim}, weight};
  return params;
}

std::map<std::string, graph::ValueId> add_llama_parameters(graph::Graph& g, const LlamaConfig& c, DType dtype) {
  std::map<std::string, graph::ValueId> params;
  for (const auto& [name, spec] : llama_parameters(c)) params[name] = g.add_parameter(name, spec.shape, dtype);
  return params;
}

LlamaGraph build_llama(graph::Graph& g, const LlamaConfig& c, int64_t batch, int64_t seq_len, DType dtype,
                       std::optional<DType> compute, bool split_loss) {
  c.validate();
  MT_CHECK(batch > 0 && seq_len > 0, "batch {} and seq_len {} must be positive", batch, seq_len);
  const auto params = add_llama_parameters(g, c, dtype);
  const graph::ValueId tokens = g.add_input("tokens", {batch, seq_len}, DType::i64);
  const graph::ValueId targets = g.add_input("targets", {batch, seq_len}, DType::i64);
  return llama_forward(g, c, params, tokens, targets, {}, compute.value_or(dtype), split_loss);
}

bool span_holds(const LlamaConfig& c, const LlamaSpan& span, const std::string& name) {
  const int64_t end = span.end_layer < 0 ? c.n_layers : span.end_layer;
  if (name == "model.embed_tokens.weight") return span.embedding || (span.head && c.tie_embeddings);
  if (name == "model.norm.weight" || name == "lm_head.weight") return span.head;
  constexpr std::string_view layers = "model.layers.";
  int64_t layer = -1;
  if (!name.starts_with(layers)) return false;
  std::from_chars(name.data() + layers.size(), name.data() + name.size(), layer);
  return layer >= span.first_layer && layer < end;
}

LlamaGraph llama_forward(graph::Graph& g, const LlamaConfig& c, const std::map<std::string, graph::ValueId>& params,
                         graph::ValueId tokens, graph::ValueId targets, graph::ValueId count, DType compute_dtype,
                         bool split_loss) {
  return llama_span_forward(g, c, LlamaSpan{}, params, tokens, targets, count, compute_dtype, split_loss);
}

LlamaGraph llama_span_forward(graph::Graph& g, const LlamaConfig& c, const LlamaSpan& span,
                              const std::map<std::string, graph::ValueId>& params, graph::ValueId input,
                              graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss) {
  c.validate();
  const int64_t end_layer = span.end_layer < 0 ? c.n_layers : span.end_layer;
  MT_CHECK(span.first_layer >= 0 && span.first_layer <= end_layer && end_layer <= c.n_layers,
           "llama_span_forward: layers [{}, {}) are not within the model's {}", span.first_layer, end_layer,
           c.n_layers);
  const Shape input_shape = g.value(input).info.shape;
  const Shape batch_shape =
      span.embedding || input_shape.rank() != 3 ? input_shape : Shape{input_shape.dim(0), input_shape.dim(1)};
  MT_CHECK(span.embedding
               ? input_shape.rank() == 2
               : input_shape.rank() == 3 && input_shape.dim(2) == c.dim && g.value(input).info.dtype == compute_dtype,
           "llama_span_forward: the input must be the tokens [batch, seq] for a span with the embedding, else the "
           "residual stream [batch, seq, {}] in {}; got {}",
           c.dim, dtype_name(compute_dtype), g.describe_value(input));
  if (span.head)
    MT_CHECK(g.value(targets).info.shape == batch_shape,
             "llama_forward: tokens and targets must both be [batch, seq], got {} and {}", batch_shape.to_string(),
             g.value(targets).info.shape.to_string());
  const int64_t batch = batch_shape.dim(0), seq_len = batch_shape.dim(1);
  graph::Builder b(g);
  LlamaGraph m;
  m.params = params;
  if (span.embedding) m.tokens = input;
  m.targets = targets;
  const int64_t hd = c.head_dim();
  // A parameter as the compute sees it: a fresh copy per use when computing
  // in another dtype, so each use's gradient is accumulated in the master dtype.
  auto use = [&](const std::string& name) {
    const graph::ValueId p = m.params.at(name);
    if (compute_dtype == g.value(p).info.dtype) return p;
    const graph::ValueId copy = b.cast(p, compute_dtype);
    m.param_copies.emplace_back(copy, p);
    return copy;
  };
  // A linear layer with Hugging Face's [out, in] weight: x @ W^T.
  auto linear = [&](graph::ValueId x, const std::string& w) { return b.matmul(x, use(w), false, true); };
  graph::ValueId h = input;
  if (span.embedding) {
    graph::ScopeGuard scope(g, "tok_embeddings");
    h = b.embedding(use("model.embed_tokens.weight"), m.tokens);  // [B, T, D]
    m.residual.push_back(h);
  }
  for (int64_t i = span.first_layer; i < end_layer; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    graph::ScopeGuard layer(g, fmt::format("layers.{}", i));
    graph::ValueId x, y, attn, act;
    {
      graph::ScopeGuard scope(g, "attention_norm");
      x = b.rms_norm(h, use(p + "input_layernorm.weight"), c.norm_eps);
      m.normed.push_back(x);
    }
    {
      graph::ScopeGuard scope(g, "attention");
      const auto q =
          b.rope(b.reshape(linear(x, p + "self_attn.q_proj.weight"), {batch, seq_len, c.n_heads, hd}), c.rope_theta);
      const auto k =
          b.rope(b.reshape(linear(x, p + "self_attn.k_proj.weight"), {batch, seq_len, c.n_kv_heads, hd}), c.rope_theta);
      const auto v = b.reshape(linear(x, p + "self_attn.v_proj.weight"), {batch, seq_len, c.n_kv_heads, hd});
      attn = b.reshape(b.attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(hd))), {batch, seq_len, c.dim});
      h = b.add(h, linear(attn, p + "self_attn.o_proj.weight"));
      m.residual.push_back(h);
    }
    {
      graph::ScopeGuard scope(g, "ffn_norm");
      y = b.rms_norm(h, use(p + "post_attention_layernorm.weight"), c.norm_eps);
      m.normed.push_back(y);
    }
    {
      graph::ScopeGuard scope(g, "feed_forward");
      // Gate before up, as the reference computes them (and not in the
      // compiler's order of evaluating arguments): what the graph's order
      // decides (selective_matmuls every_other) is the same on every build.
      const graph::ValueId gate = linear(y, p + "mlp.gate_proj.weight");
      const graph::ValueId up = linear(y, p + "mlp.up_proj.weight");
      act = b.swiglu(gate, up);
      h = b.add(h, linear(act, p + "mlp.down_proj.weight"));
      m.residual.push_back(h);
    }
  }
  if (!span.head) {
    m.output = h;
    return m;
  }
  graph::ValueId logits;
  {
    graph::ScopeGuard scope(g, "norm");
    h = b.rms_norm(h, use("model.norm.weight"), c.norm_eps);
    m.normed.push_back(h);
  }
  {
    graph::ScopeGuard scope(g, "output");
    logits = linear(h, c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  }
  graph::ScopeGuard scope(g, "loss");
  const graph::ValueId flat_logits = b.reshape(logits, {batch * seq_len, c.vocab_size});
  const graph::ValueId flat_targets = b.reshape(m.targets, {batch * seq_len});
  m.logits.push_back(flat_logits);
  m.loss = split_loss ? b.cross_entropy_split(flat_logits, flat_targets, -100, count)
                      : b.cross_entropy(flat_logits, flat_targets, -100, count);
  return m;
}

}  // namespace meshtrain::models
