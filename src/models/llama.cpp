#include "models/llama.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "core/copy.h"
#include "core/error.h"
#include "graph/builder.h"

namespace meshtrain::models {

namespace {

// A linear layer inside the blocks: its [out, in] weight (not a norm's, not
// the stacked experts'), and not a MoE router.
bool is_block_linear(const std::string& weight) {
  return weight.starts_with("model.layers.") &&
         (weight.ends_with("_proj.weight") || weight.find(".shared_experts.w") != std::string::npos);
}

std::string layer_of(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string_view(".weight").size());
}

}  // namespace

bool Fp8Linears::applies_to(const std::string& weight) const {
  if (!enabled || !is_block_linear(weight)) return false;
  const std::string layer = layer_of(weight);
  return std::none_of(skip.begin(), skip.end(),
                      [&](const std::string& pattern) { return layer.find(pattern) != std::string::npos; });
}

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
  MT_CHECK(n_experts >= 0 && moe_ffn_dim >= 0 && first_dense_layers >= 0 && n_shared_experts >= 0,
           "model: n_experts, moe_ffn_dim, first_dense_layers and n_shared_experts must be >= 0");
  MT_CHECK(std::isfinite(router_aux_loss_coef) && std::isfinite(capacity_factor) && router_aux_loss_coef >= 0 &&
               capacity_factor >= 0,
           "model: router_aux_loss_coef {} and capacity_factor {} must be finite and >= 0", router_aux_loss_coef,
           capacity_factor);
  if (fp8.enabled && !fp8.skip.empty()) {
    const auto params = llama_parameters(*this);
    for (const std::string& pattern : fp8.skip)
      MT_CHECK(std::any_of(params.begin(), params.end(),
                           [&](const auto& p) {
                             return is_block_linear(p.first) && layer_of(p.first).find(pattern) != std::string::npos;
                           }),
               "training.fp8_skip: '{}' is in the name of no linear layer inside the blocks (names such as "
               "model.layers.0.self_attn.q_proj, model.layers.0.mlp.down_proj), so it would leave out nothing",
               pattern);
  }
  if (n_experts == 0) return;
  MT_CHECK(n_experts_per_token >= 1 && n_experts_per_token <= n_experts,
           "model: n_experts_per_token {} must be between 1 and n_experts {}", n_experts_per_token, n_experts);
  MT_CHECK(
      first_dense_layers < n_layers,
      "model: first_dense_layers {} leaves none of the {} layers a mixture of experts; lower it or set n_experts 0",
      first_dense_layers, n_layers);
}

std::string describe(const LlamaConfig& c) {
  // A dense MLP's width only where some layer has one.
  const std::string ffn = c.moe_layers() < c.n_layers ? fmt::format(", ffn {}", c.ffn_dim) : std::string();
  std::string out = fmt::format("Llama dim {} x {} layers, {} heads ({} kv){}, vocab {}", c.dim, c.n_layers, c.n_heads,
                                c.n_kv_heads, ffn, c.vocab_size);
  if (c.moe_layers() == 0) return out;
  return out + fmt::format(", {} experts (top {}, ffn {}{}) in layers {}-{}", c.n_experts, c.n_experts_per_token,
                           c.expert_ffn_dim(),
                           c.n_shared_experts ? fmt::format(", {} shared", c.n_shared_experts) : std::string(),
                           c.first_dense_layers, c.n_layers - 1);
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
    if (!c.is_moe_layer(i)) {
      params[p + "mlp.gate_proj.weight"] = {{c.ffn_dim, c.dim}, weight};
      params[p + "mlp.up_proj.weight"] = {{c.ffn_dim, c.dim}, weight};
      params[p + "mlp.down_proj.weight"] = {{c.dim, c.ffn_dim}, weight};
      continue;
    }
    const int64_t e = c.n_experts, f = c.expert_ffn_dim(), shared = c.n_shared_experts * f;
    params[p + "block_sparse_moe.gate.weight"] = {{e, c.dim}, weight};
    params[p + "block_sparse_moe.experts.w1.weight"] = {{e, f, c.dim}, weight};
    params[p + "block_sparse_moe.experts.w3.weight"] = {{e, f, c.dim}, weight};
    params[p + "block_sparse_moe.experts.w2.weight"] = {{e, c.dim, f}, weight};
    if (shared == 0) continue;
    params[p + "block_sparse_moe.shared_experts.w1.weight"] = {{shared, c.dim}, weight};
    params[p + "block_sparse_moe.shared_experts.w3.weight"] = {{shared, c.dim}, weight};
    params[p + "block_sparse_moe.shared_experts.w2.weight"] = {{c.dim, shared}, weight};
  }
  params["model.norm.weight"] = {{c.dim}, norm_scale};
  if (!c.tie_embeddings) params["lm_head.weight"] = {{c.vocab_size, c.dim}, weight};
  return params;
}

namespace {

// "model.layers.3.block_sparse_moe.experts.w1.weight" -> its part before and after "experts.", when it names a
// stacked expert tensor.
constexpr std::string_view kExperts = "block_sparse_moe.experts.";
constexpr std::string_view kLayers = "model.layers.";

// The index that follows `prefix` at the start of `name` ("model.layers.3.mlp..." -> 3).
std::optional<int64_t> index_after(std::string_view name, std::string_view prefix) {
  int64_t index = -1;
  if (!name.starts_with(prefix)) return std::nullopt;
  const auto [end, error] = std::from_chars(name.data() + prefix.size(), name.data() + name.size(), index);
  if (error != std::errc{} || end == name.data() + prefix.size()) return std::nullopt;
  return index;
}

std::optional<std::pair<std::string, std::string>> stacked_expert_name(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  const std::string tail = name.substr(at + kExperts.size());
  if (tail != "w1.weight" && tail != "w2.weight" && tail != "w3.weight") return std::nullopt;
  return std::pair{name.substr(0, at + kExperts.size()), tail};
}

}  // namespace

std::optional<int64_t> parameter_layer(std::string_view name) { return index_after(name, kLayers); }

std::string missing_tensor_hint(const std::string& name, const std::map<std::string, Tensor>& tensors) {
  const std::optional<int64_t> layer = parameter_layer(name);
  if (!layer) return "";
  const std::string prefix = fmt::format("{}{}.", kLayers, *layer);
  bool dense = false, sparse = false, shared = false;
  int64_t experts = 0;  // in the file: one more than the largest expert index
  for (auto it = tensors.lower_bound(prefix); it != tensors.end() && it->first.starts_with(prefix); ++it) {
    const std::string_view rest = std::string_view(it->first).substr(prefix.size());
    dense |= rest.starts_with("mlp.");
    sparse |= rest.starts_with("block_sparse_moe.");
    shared |= rest.starts_with("block_sparse_moe.shared_experts.");
    if (const auto e = index_after(rest, kExperts)) experts = std::max(experts, *e + 1);
  }
  if (name.find(".mlp.") != std::string::npos && sparse && !dense)
    return fmt::format(
        "; the file's layer {} is a mixture of experts (block_sparse_moe.*), not a dense MLP: set model.n_experts "
        "(and model.first_dense_layers) as the file's model had them",
        *layer);
  if (name.find(".block_sparse_moe.") != std::string::npos && dense && !sparse)
    return fmt::format(
        "; the file's layer {} has a dense MLP (mlp.*): set model.n_experts 0, or "
        "model.first_dense_layers above {}",
        *layer, *layer);
  if (name.find(".shared_experts.") != std::string::npos && sparse && !shared)
    return fmt::format("; the file's layer {} has no shared experts: set model.n_shared_experts 0", *layer);
  const auto wanted = index_after(std::string_view(name).substr(prefix.size()), kExperts);
  if (wanted && experts > 0 && *wanted >= experts)
    return fmt::format("; the file's layer {} holds {} experts: set model.n_experts {}", *layer, experts, experts);
  return "";
}

std::map<std::string, Tensor> hf_tensors(std::map<std::string, Tensor> tensors) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : tensors) {
    const auto parts = stacked_expert_name(name);
    if (!parts || t.shape().rank() != 3) {
      out.emplace(name, std::move(t));
      continue;
    }
    const Shape one{t.shape().dim(1), t.shape().dim(2)};
    const size_t bytes = static_cast<size_t>(one.numel()) * dtype_size(t.dtype());
    for (int64_t e = 0; e < t.shape().dim(0); ++e) {
      Tensor expert = Tensor::empty(one, t.dtype());
      copy_bytes(expert.raw(), static_cast<const char*>(std::as_const(t).raw()) + static_cast<size_t>(e) * bytes,
                 bytes);
      out.emplace(fmt::format("{}{}.{}", parts->first, e, parts->second), std::move(expert));
    }
  }
  return out;
}

std::map<std::string, Tensor> from_hf_tensors(std::map<std::string, Tensor> tensors,
                                              const std::map<std::string, ParameterSpec>& specs) {
  for (const auto& [name, spec] : specs) {
    const auto parts = stacked_expert_name(name);
    if (!parts || tensors.contains(name)) continue;
    const Shape one{spec.shape.dim(1), spec.shape.dim(2)};
    Tensor stacked;
    for (int64_t e = 0; e < spec.shape.dim(0); ++e) {
      const std::string expert = fmt::format("{}{}.{}", parts->first, e, parts->second);
      auto it = tensors.find(expert);
      MT_CHECK(it != tensors.end(), "tensor '{}' is missing (expert {} of {}){}", expert, e, spec.shape.dim(0),
               missing_tensor_hint(expert, tensors));
      MT_CHECK(it->second.shape() == one, "tensor '{}' has shape {}, the model expects {}", expert,
               it->second.shape().to_string(), one.to_string());
      if (e == 0) stacked = Tensor::empty(spec.shape, it->second.dtype());
      MT_CHECK(it->second.dtype() == stacked.dtype(), "tensor '{}' is {}, expert 0's is {}", expert,
               dtype_name(it->second.dtype()), dtype_name(stacked.dtype()));
      copy_bytes(static_cast<char*>(stacked.raw()) + static_cast<size_t>(e) * it->second.nbytes(),
                 std::as_const(it->second).raw(), it->second.nbytes());
      tensors.erase(it);
    }
    tensors.emplace(name, std::move(stacked));
  }
  return tensors;
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

bool span_takes_router_stats(const LlamaConfig& c, const LlamaSpan& span) {
  return c.has_load_balancing_loss() && span.first_layer > c.first_dense_layers;
}

bool span_gives_router_stats(const LlamaConfig& c, const LlamaSpan& span) {
  const int64_t end = span.end_layer < 0 ? c.n_layers : span.end_layer;
  return c.has_load_balancing_loss() && !span.head && end > c.first_dense_layers;
}

DType router_stats_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

bool span_holds(const LlamaConfig& c, const LlamaSpan& span, const std::string& name) {
  const int64_t end = span.end_layer < 0 ? c.n_layers : span.end_layer;
  if (name == "model.embed_tokens.weight") return span.embedding || (span.head && c.tie_embeddings);
  if (name == "model.norm.weight" || name == "lm_head.weight") return span.head;
  const std::optional<int64_t> layer = parameter_layer(name);
  return layer && *layer >= span.first_layer && *layer < end;
}

namespace {

// The sparse block of one layer on its normed input y [B, T, D]: the router,
// the top-k experts' SwiGLU MLPs over the tokens permuted into runs by
// expert, their outputs weighted back into token order, plus the shared
// experts. `use` gives a parameter as the compute sees it, `linear` x W^T.
template <typename Use, typename Linear>
graph::ValueId sparse_moe(graph::Builder& b, const LlamaConfig& c, LlamaGraph& m, const std::string& p,
                          graph::ValueId y, Use&& use, Linear&& linear) {
  // Under context parallelism each cp rank's part of a sequence is a group
  // of tokens of its own ([B, cp, T / cp, D]: the MoE ops sort each group by
  // expert on its own), so that the split on the sequence is one of groups.
  const Shape whole = b.graph().value(y).info.shape;
  const int64_t parts = c.seq_chunks / 2;
  if (parts > 1) y = b.reshape(y, {whole.dim(0), parts, whole.dim(1) / parts, whole.dim(2)});
  const DType compute = b.graph().value(y).info.dtype;
  const DType router = router_stats_dtype(compute);  // softmax in f32, as Hugging Face's
  const int64_t k = c.n_experts_per_token;
  const graph::ValueId logits = linear(y, p + "gate.weight");
  const graph::ValueId probs = b.softmax(compute == router ? logits : b.cast(logits, router));
  const graph::ValueId experts = b.moe_topk(probs, k);
  graph::ValueId weights = b.moe_route_weights(probs, experts);
  if (compute != router) weights = b.cast(weights, compute);
  if (c.has_load_balancing_loss()) {
    const graph::ValueId stats = b.moe_router_stats(probs, experts);
    m.router_stats = m.router_stats.valid() ? b.add(m.router_stats, stats) : stats;
  }
  const graph::Builder::MoeSort sorted = b.moe_sort(experts, c.n_experts, c.capacity_factor);
  m.expert_load.push_back(b.moe_expert_counts(sorted.row_expert, c.n_experts + 1));  // the dropped count as n_experts
  graph::ValueId rows = b.moe_permute(y, sorted.order, k), row_expert = sorted.row_expert;
  const int64_t blocks = c.dispatch_blocks > 1 ? c.dispatch_blocks : 0;
  if (blocks > 0) {  // expert parallelism: the rows by block of experts (their experts first), and back after
    row_expert = b.moe_dispatch_experts(sorted.row_expert, blocks, c.n_experts);
    rows = b.moe_dispatch(rows, sorted.row_expert, blocks, c.n_experts);
    m.dispatched_experts.push_back(row_expert);
  }
  const graph::ValueId gate = b.grouped_matmul(rows, use(p + "experts.w1.weight"), row_expert, true, blocks);
  const graph::ValueId up = b.grouped_matmul(rows, use(p + "experts.w3.weight"), row_expert, true, blocks);
  graph::ValueId down = b.grouped_matmul(b.swiglu(gate, up), use(p + "experts.w2.weight"), row_expert, true, blocks);
  if (blocks > 0) {
    m.dispatched_rows.insert(m.dispatched_rows.end(), {{rows, row_expert}, {down, row_expert}});
    down = b.moe_undispatch(down, sorted.row_expert, blocks, c.n_experts);
  }
  graph::ValueId out = b.moe_combine(down, sorted.order, weights, k);
  if (c.n_shared_experts > 0) {
    const graph::ValueId shared_gate = linear(y, p + "shared_experts.w1.weight");
    const graph::ValueId shared_up = linear(y, p + "shared_experts.w3.weight");
    out = b.add(out, linear(b.swiglu(shared_gate, shared_up), p + "shared_experts.w2.weight"));
  }
  return parts > 1 ? b.reshape(out, whole) : out;
}

}  // namespace

LlamaGraph llama_forward(graph::Graph& g, const LlamaConfig& c, const std::map<std::string, graph::ValueId>& params,
                         graph::ValueId tokens, graph::ValueId targets, graph::ValueId count, DType compute_dtype,
                         bool split_loss, double aux_weight) {
  return llama_span_forward(g, c, LlamaSpan{}, params, tokens, targets, count, compute_dtype, split_loss, aux_weight);
}

LlamaGraph llama_span_forward(graph::Graph& g, const LlamaConfig& c, const LlamaSpan& span,
                              const std::map<std::string, graph::ValueId>& params, graph::ValueId input,
                              graph::ValueId targets, graph::ValueId count, DType compute_dtype, bool split_loss,
                              double aux_weight, graph::ValueId router_stats) {
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
  MT_CHECK(router_stats.valid() == span_takes_router_stats(c, span) &&
               (!router_stats.valid() ||
                g.value(router_stats).info == graph::ValueInfo{{2, c.n_experts}, router_stats_dtype(compute_dtype)}),
           "llama_span_forward: a span from layer {} takes the router statistics [2, {}] {} of the MoE layers before "
           "it exactly when the load-balancing loss is on and there are some; given {}",
           span.first_layer, c.n_experts, dtype_name(router_stats_dtype(compute_dtype)),
           router_stats.valid() ? g.describe_value(router_stats) : "none");
  LlamaGraph m;
  m.params = params;
  m.router_stats = router_stats;
  if (span.embedding) m.tokens = input;
  m.targets = targets;
  // Context parallelism: the tokens and targets in load-balanced order, so
  // that each cp rank's part of the sequence is as much work as another's.
  const int64_t chunks = c.seq_chunks;
  MT_CHECK(chunks == 1 || (chunks % 2 == 0 && seq_len % chunks == 0),
           "the sequence of {} does not cut into {} load-balanced chunks (2 x parallel.cp)", seq_len, chunks);
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
  // In FP8 (c.fp8), each operand quantised with the scale of its amax (one
  // amax of an input that several layers read: q, k and v's; gate and up's).
  std::map<graph::ValueId, graph::ValueId> input_amax;
  auto linear = [&](graph::ValueId x, const std::string& w) {
    if (!c.fp8.applies_to(w)) return b.matmul(x, use(w), false, true);
    const std::string layer = w.substr(0, w.size() - std::string_view(".weight").size());
    const graph::ValueId weight = use(w);
    auto [known, fresh] = input_amax.emplace(x, graph::ValueId{});
    if (fresh) known->second = b.amax(x, layer + " input");
    const graph::ValueId weight_amax = b.amax(weight, layer + " weight");
    const graph::ValueId operand =
        c.fp8.all_gather ? b.op("fp8_quantize", {weight, weight_amax},
                                {graph::attr::dtype(c.fp8.format), graph::attr::pow2_scale(c.fp8.pow2_scale),
                                 graph::attr::tensor(layer + " weight")})
                         : weight;
    return b.fp8_matmul(
        x, operand, known->second, weight_amax, false, true,
        {graph::attr::format_a(c.fp8.format), graph::attr::format_b(c.fp8.format),
         graph::attr::grad_format(c.fp8.grad_format), graph::attr::pow2_scale(c.fp8.pow2_scale),
         graph::attr::tensor(layer), graph::attr::operand_a("input"), graph::attr::operand_b("weight")});
  };
  graph::ValueId h = input;
  if (span.embedding) {
    graph::ScopeGuard scope(g, "tok_embeddings");
    const graph::ValueId tokens = chunks > 1 ? b.reorder_sequence(m.tokens, chunks) : m.tokens;
    h = b.embedding(use("model.embed_tokens.weight"), tokens);  // [B, T, D]
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
      const auto q = b.rope(b.reshape(linear(x, p + "self_attn.q_proj.weight"), {batch, seq_len, c.n_heads, hd}),
                            c.rope_theta, chunks);
      auto k = b.rope(b.reshape(linear(x, p + "self_attn.k_proj.weight"), {batch, seq_len, c.n_kv_heads, hd}),
                      c.rope_theta, chunks);
      auto v = b.reshape(linear(x, p + "self_attn.v_proj.weight"), {batch, seq_len, c.n_kv_heads, hd});
      const bool ring = chunks > 1 && c.ring_attention;
      if (chunks > 1 && !ring) {  // the keys whole and in position order (all-gathered under context parallelism)
        k = b.reorder_sequence(k, chunks, true);
        v = b.reorder_sequence(v, chunks, true);
        m.attention_keys.insert(m.attention_keys.end(), {k, v});
      }
      attn = b.reshape(b.attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(hd)), chunks, ring),
                       {batch, seq_len, c.dim});
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
      if (c.is_moe_layer(i)) {
        h = b.add(h, sparse_moe(b, c, m, p + "block_sparse_moe.", y, use, linear));
      } else {
        // Gate before up, as the reference computes them (and not in the
        // compiler's order of evaluating arguments): what the graph's order
        // decides (selective_matmuls every_other) is the same on every build.
        const graph::ValueId gate = linear(y, p + "mlp.gate_proj.weight");
        const graph::ValueId up = linear(y, p + "mlp.up_proj.weight");
        act = b.swiglu(gate, up);
        h = b.add(h, linear(act, p + "mlp.down_proj.weight"));
      }
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
  // Under context parallelism the logits stay [B, T, V], split by sequence
  // (rows of [B * T, V] would not be a split a layout can say).
  const graph::ValueId flat_logits = chunks > 1 ? logits : b.reshape(logits, {batch * seq_len, c.vocab_size});
  const graph::ValueId flat_targets =
      chunks > 1 ? b.reorder_sequence(m.targets, chunks) : b.reshape(m.targets, {batch * seq_len});
  m.logits.push_back(flat_logits);
  m.loss = m.ce_loss = split_loss ? b.cross_entropy_split(flat_logits, flat_targets, -100, count)
                                  : b.cross_entropy(flat_logits, flat_targets, -100, count);
  if (c.has_load_balancing_loss()) {
    // Hugging Face's load_balancing_loss_func: n_experts x the sum over
    // experts of (the share of top-k picks it got) x (its mean probability),
    // the tokens of every MoE layer taken together.
    const double rows = static_cast<double>(batch * seq_len) * static_cast<double>(c.moe_layers());
    m.aux_loss = b.moe_aux_loss(m.router_stats, static_cast<double>(c.n_experts) / (rows * rows));
    graph::ValueId weighted = b.scale(m.aux_loss, c.router_aux_loss_coef * aux_weight);
    if (g.value(weighted).info.dtype != g.value(m.ce_loss).info.dtype)
      weighted = b.cast(weighted, g.value(m.ce_loss).info.dtype);
    m.loss = b.add(m.ce_loss, weighted);
  }
  return m;
}

}  // namespace meshtrain::models
