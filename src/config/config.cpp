#include "config/config.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace meshtrain::config {

void TrainConfig::set_cp_attention(parallel::ParallelConfig::CpAttention mode) {
  parallel.cp_attention = mode;
  model.ring_attention = parallel.cp > 1 && mode == parallel::ParallelConfig::CpAttention::ring;
}

double TrainConfig::lr_at(int64_t step) const {
  const double lr = optimizer.lr;
  const int64_t warmup = lr_scheduler.warmup_steps;
  if (step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
  if (lr_scheduler.decay == LrDecay::none || training.steps <= warmup) return lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(training.steps - warmup);
  const double min = lr_scheduler.min_lr_ratio;
  if (lr_scheduler.decay == LrDecay::linear) return lr * (1.0 - (1.0 - min) * progress);
  return lr * (min + (1.0 - min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

namespace {

// One configuration key: how to set it from a TOML node or a command-line string.
struct Key {
  std::string name;  // "section.key"
  std::function<void(TrainConfig&, const toml::node&)> from_toml;
  std::function<void(TrainConfig&, const std::string&)> from_text;
  std::string expects;                            // what a value must be, and what it means, for --help
  std::function<std::string(TrainConfig&)> show;  // the value a config holds, as TOML writes it
  std::string default_text;                       // the default, as --section.key takes it
};

// `key` with its default: what a TrainConfig holds until it is set.
Key with_default(const std::string& default_text, Key key) {
  key.default_text = default_text;
  return key;
}

std::string toml_text(const toml::node& n) {
  std::ostringstream out;
  n.visit([&](auto&& v) { out << v; });
  return out.str();
}

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const std::string& expected) {
  throw InvalidArgument(fmt::format("config key {}: '{}' is not {}", key, value, expected));
}

template <typename T>
Key number_key(std::string name, const std::string& default_text, std::function<T&(TrainConfig&)> field,
               std::function<bool(T)> valid, std::string constraint) {
  auto set = [name, field, valid, constraint](TrainConfig& c, T v, const std::string& text) {
    if (!valid(v)) bad_value(name, text, constraint);
    field(c) = v;
  };
  return with_default(default_text,
                      {name,
                       [name, set](TrainConfig& c, const toml::node& n) {
                         if constexpr (std::is_same_v<T, double>) {
                           auto v = n.value<double>();  // integers are accepted as reals
                           if (!v) bad_value(name, toml_text(n), "a number");
                           set(c, *v, toml_text(n));
                         } else {
                           auto v = n.as_integer();
                           if (!v) bad_value(name, toml_text(n), "an integer");
                           set(c, static_cast<T>(v->get()), toml_text(n));
                         }
                       },
                       [name, set](TrainConfig& c, const std::string& text) {
                         size_t used = 0;
                         T v{};
                         try {
                           if constexpr (std::is_same_v<T, double>)
                             v = std::stod(text, &used);
                           else
                             v = static_cast<T>(std::stoll(text, &used));
                         } catch (const std::out_of_range&) {
                           bad_value(name, text,
                                     std::is_same_v<T, double> ? "a number a double holds" : "an integer below 2^63");
                         } catch (const std::exception&) {
                           used = 0;
                         }
                         if (used == 0 || used != text.size())
                           bad_value(name, text, std::is_same_v<T, double> ? "a number" : "an integer");
                         set(c, v, text);
                       },
                       constraint, [field](TrainConfig& c) { return fmt::format("{}", field(c)); }});
}

// A key whose value is text: a TOML string, or the command-line text as is.
Key text_key(std::string name, std::function<void(TrainConfig&, const std::string&)> set, std::string expects,
             std::function<std::string(TrainConfig&)> show) {
  return {name,
          [name, set](TrainConfig& c, const toml::node& n) {
            auto v = n.value<std::string>();
            if (!v) bad_value(name, toml_text(n), "a string");
            set(c, *v);
          },
          set, std::move(expects), std::move(show)};
}

// `text` as a TOML basic string: quoted, its quotes, backslashes and control
// characters escaped (a path may hold any of them).
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      out += {'\\', ch};
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\u{:04X}", c);
    else
      out += ch;
  }
  return out + "\"";
}

Key string_key(std::string name, const std::string& default_text, std::function<std::string&(TrainConfig&)> field,
               std::string expects) {
  return with_default(default_text, text_key(
                                        name, [field](TrainConfig& c, const std::string& v) { field(c) = v; },
                                        std::move(expects), [field](TrainConfig& c) { return toml_string(field(c)); }));
}

// A key naming one of a few choices (an enum, a dtype spelled as PyTorch spells it), and what they mean.
template <typename E>
Key choice_key(std::string name, const std::string& default_text, std::function<E&(TrainConfig&)> field,
               std::vector<std::pair<std::string, E>> choices, const std::string& meaning = "") {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  std::string expects = fmt::format("one of {}", fmt::join(names, ", "));
  const std::string described = meaning.empty() ? expects : expects + ": " + meaning;
  return with_default(default_text, text_key(
                                        name,
                                        [name, field, choices, expects](TrainConfig& c, const std::string& v) {
                                          for (const auto& [choice, value] : choices) {
                                            if (v == choice) {
                                              field(c) = value;
                                              return;
                                            }
                                          }
                                          bad_value(name, v, expects);
                                        },
                                        described,
                                        [field, choices](TrainConfig& c) {
                                          for (const auto& [choice, value] : choices)
                                            if (field(c) == value) return fmt::format("\"{}\"", choice);
                                          return std::string("?");
                                        }));
}

Key bool_key(std::string name, const std::string& default_text, std::function<bool&(TrainConfig&)> field,
             const std::string& meaning) {
  return with_default(default_text, {name,
                                     [name, field](TrainConfig& c, const toml::node& n) {
                                       auto v = n.value<bool>();
                                       if (!v) bad_value(name, toml_text(n), "true or false");
                                       field(c) = *v;
                                     },
                                     [name, field](TrainConfig& c, const std::string& text) {
                                       if (text != "true" && text != "false") bad_value(name, text, "true or false");
                                       field(c) = text == "true";
                                     },
                                     "true or false: " + meaning,
                                     [field](TrainConfig& c) { return std::string(field(c) ? "true" : "false"); }});
}

// A key whose value is a list: a TOML array, or the command-line text
// "a,b,c" ("": empty). `item` reads one item from a TOML node (nullopt: the
// wrong type) and `parse` one from its text, each failing through bad_value
// with the whole value; `show` writes one as TOML does. `kind` says what a
// TOML value must be ("an array of ...").
template <typename T>
Key list_key(std::string name, const std::string& default_text, std::function<std::vector<T>&(TrainConfig&)> field,
             std::string expects, std::string kind,
             std::function<std::optional<T>(const toml::node&, const std::string& whole)> item,
             std::function<T(const std::string& text, const std::string& whole)> parse,
             std::function<std::string(const T&)> show) {
  return with_default(default_text, {name,
                                     [name, field, item, kind](TrainConfig& c, const toml::node& n) {
                                       const toml::array* list = n.as_array();
                                       if (!list) bad_value(name, toml_text(n), kind);
                                       std::vector<T> values;
                                       for (const toml::node& node : *list) {
                                         std::optional<T> v = item(node, toml_text(n));
                                         if (!v) bad_value(name, toml_text(n), kind);
                                         values.push_back(std::move(*v));
                                       }
                                       field(c) = std::move(values);
                                     },
                                     [field, parse](TrainConfig& c, const std::string& text) {
                                       std::vector<T> values;
                                       std::stringstream items(text);
                                       for (std::string one; std::getline(items, one, ',');)
                                         values.push_back(parse(one, text));
                                       field(c) = std::move(values);
                                     },
                                     std::move(expects),
                                     [field, show](TrainConfig& c) {
                                       std::vector<std::string> shown;
                                       for (const T& v : field(c)) shown.push_back(show(v));
                                       return fmt::format("[{}]", fmt::join(shown, ", "));
                                     }});
}

// A list of positive integers: a TOML array, or the command-line text "3,2,3".
Key count_list_key(std::string name, const std::string& default_text,
                   std::function<std::vector<int64_t>&(TrainConfig&)> field, std::string expects) {
  auto element = [name](int64_t v, const std::string& whole) {
    if (v < 1 || v > (int64_t{1} << 40)) bad_value(name, whole, "a list of positive integers");
    return v;
  };
  return list_key<int64_t>(
      name, default_text, std::move(field), std::move(expects), "an array of positive integers",
      [element](const toml::node& n, const std::string& whole) -> std::optional<int64_t> {
        const auto v = n.as_integer();
        if (!v) return std::nullopt;
        return element(v->get(), whole);
      },
      [name, element](const std::string& item, const std::string& whole) {
        size_t used = 0;
        int64_t v = 0;
        try {
          v = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != item.size()) bad_value(name, whole, "a list of positive integers such as 3,2,3");
        return element(v, whole);
      },
      [](const int64_t& v) { return std::to_string(v); });
}

// A list of non-empty strings: a TOML array of strings, or "a,b,c".
Key name_list_key(std::string name, const std::string& default_text,
                  std::function<std::vector<std::string>&(TrainConfig&)> field, std::string expects) {
  auto element = [name](const std::string& v, const std::string& whole) {
    if (v.empty()) bad_value(name, whole, "a list of non-empty strings");
    return v;
  };
  return list_key<std::string>(
      name, default_text, std::move(field), std::move(expects), "an array of non-empty strings",
      [element](const toml::node& n, const std::string& whole) -> std::optional<std::string> {
        const auto v = n.value<std::string>();
        if (!v) return std::nullopt;
        return element(*v, whole);
      },
      element, toml_string);
}

const std::vector<Key>& keys() {
  auto pos = [](int64_t v) { return v > 0; };
  auto nonneg = [](int64_t v) { return v >= 0; };
  // Finite: no key means anything by infinity, and a cast of it to an
  // integer (a capacity, a byte count) is undefined.
  auto posf = [](double v) { return std::isfinite(v) && v > 0; };
  auto nonnegf = [](double v) { return std::isfinite(v) && v >= 0; };
  auto unit = [](double v) { return v >= 0 && v < 1; };
  static const std::vector<Key> table = {
      number_key<int64_t>(
          "model.dim", "256", [](TrainConfig& c) -> int64_t& { return c.model.dim; }, pos, "a positive integer"),
      number_key<int64_t>(
          "model.n_layers", "6", [](TrainConfig& c) -> int64_t& { return c.model.n_layers; }, pos,
          "a positive integer"),
      number_key<int64_t>(
          "model.n_heads", "16", [](TrainConfig& c) -> int64_t& { return c.model.n_heads; }, pos, "a positive integer"),
      number_key<int64_t>(
          "model.n_kv_heads", "16", [](TrainConfig& c) -> int64_t& { return c.model.n_kv_heads; }, pos,
          "a positive integer"),
      number_key<int64_t>(
          "model.ffn_dim", "768", [](TrainConfig& c) -> int64_t& { return c.model.ffn_dim; }, pos,
          "a positive integer"),
      number_key<int64_t>(
          "model.vocab_size", "256", [](TrainConfig& c) -> int64_t& { return c.model.vocab_size; }, pos,
          "a positive integer"),
      number_key<double>(
          "model.norm_eps", "1e-05", [](TrainConfig& c) -> double& { return c.model.norm_eps; }, posf,
          "a positive number"),
      number_key<double>(
          "model.rope_theta", "10000", [](TrainConfig& c) -> double& { return c.model.rope_theta; }, posf,
          "a positive number"),
      bool_key(
          "model.tie_embeddings", "false", [](TrainConfig& c) -> bool& { return c.model.tie_embeddings; },
          "the output projection is the token embedding's weight"),
      number_key<int64_t>(
          "model.n_experts", "0", [](TrainConfig& c) -> int64_t& { return c.model.n_experts; }, nonneg,
          "an integer >= 0: the experts of each mixture-of-experts layer (Mixtral's sparse block); 0: dense"),
      number_key<int64_t>(
          "model.n_experts_per_token", "2", [](TrainConfig& c) -> int64_t& { return c.model.n_experts_per_token; }, pos,
          "a positive integer: the experts each token is routed to (top-k), at most model.n_experts"),
      number_key<int64_t>(
          "model.moe_ffn_dim", "0", [](TrainConfig& c) -> int64_t& { return c.model.moe_ffn_dim; }, nonneg,
          "an integer >= 0: each expert's SwiGLU hidden size; 0: model.ffn_dim"),
      number_key<int64_t>(
          "model.first_dense_layers", "0", [](TrainConfig& c) -> int64_t& { return c.model.first_dense_layers; },
          nonneg, "an integer >= 0: the first layers keep a dense MLP of model.ffn_dim (as DeepSeek's)"),
      number_key<int64_t>(
          "model.n_shared_experts", "0", [](TrainConfig& c) -> int64_t& { return c.model.n_shared_experts; }, nonneg,
          "an integer >= 0: a SwiGLU of n_shared_experts x moe_ffn_dim every token also goes through, added "
          "unweighted (DeepSeek's shared experts)"),
      number_key<double>(
          "model.router_aux_loss_coef", "0", [](TrainConfig& c) -> double& { return c.model.router_aux_loss_coef; },
          nonnegf,
          "a number >= 0: the load-balancing loss's weight in the loss (Switch Transformer's, as Hugging "
          "Face's load_balancing_loss_func); 0: none"),
      number_key<double>(
          "model.capacity_factor", "0", [](TrainConfig& c) -> double& { return c.model.capacity_factor; }, nonnegf,
          "a number >= 0: each expert takes at most capacity_factor x its even share of a sequence's top-k slots, "
          "dropping the rest; 0: dropless"),
      string_key(
          "data.path", "", [](TrainConfig& c) -> std::string& { return c.data.path; },
          "a .txt file (bytes as tokens), an llm.c .bin token shard, or a directory or glob of shards; required"),
      number_key<int64_t>(
          "data.seq_len", "128", [](TrainConfig& c) -> int64_t& { return c.data.seq_len; }, pos, "a positive integer"),
      number_key<int64_t>(
          "data.batch_size", "8", [](TrainConfig& c) -> int64_t& { return c.data.batch_size; }, pos,
          "a positive integer"),
      number_key<double>(
          "optimizer.lr", "0.0003", [](TrainConfig& c) -> double& { return c.optimizer.lr; }, nonnegf, "a number >= 0"),
      number_key<double>(
          "optimizer.beta1", "0.9", [](TrainConfig& c) -> double& { return c.optimizer.beta1; }, unit, "in [0, 1)"),
      number_key<double>(
          "optimizer.beta2", "0.95", [](TrainConfig& c) -> double& { return c.optimizer.beta2; }, unit, "in [0, 1)"),
      number_key<double>(
          "optimizer.eps", "1e-08", [](TrainConfig& c) -> double& { return c.optimizer.eps; }, posf,
          "a positive number"),
      number_key<double>(
          "optimizer.weight_decay", "0.1", [](TrainConfig& c) -> double& { return c.optimizer.weight_decay; }, nonnegf,
          "a number >= 0"),
      choice_key<DType>("optimizer.state_dtype", "float32",
                        [](TrainConfig& c) -> DType& { return c.optimizer.state_dtype; },
                        {{"float32", DType::f32}, {"bfloat16", DType::bf16}}),
      number_key<int64_t>(
          "lr_scheduler.warmup_steps", "0", [](TrainConfig& c) -> int64_t& { return c.lr_scheduler.warmup_steps; },
          nonneg, "an integer >= 0"),
      choice_key<LrDecay>("lr_scheduler.decay", "none", [](TrainConfig& c) -> LrDecay& { return c.lr_scheduler.decay; },
                          {{"none", LrDecay::none}, {"linear", LrDecay::linear}, {"cosine", LrDecay::cosine}}),
      number_key<double>(
          "lr_scheduler.min_lr_ratio", "0", [](TrainConfig& c) -> double& { return c.lr_scheduler.min_lr_ratio; },
          [](double v) { return v >= 0 && v <= 1; }, "in [0, 1]"),
      number_key<int64_t>(
          "training.steps", "100", [](TrainConfig& c) -> int64_t& { return c.training.steps; }, pos,
          "a positive integer"),
      number_key<double>(
          "training.max_grad_norm", "1", [](TrainConfig& c) -> double& { return c.training.max_grad_norm; }, nonnegf,
          "a number >= 0 (0: no clipping)"),
      number_key<int64_t>(
          "training.seed", "0", [](TrainConfig& c) -> int64_t& { return c.training.seed; }, nonneg, "an integer >= 0"),
      choice_key<DType>("training.dtype", "float32", [](TrainConfig& c) -> DType& { return c.training.dtype; },
                        {{"float32", DType::f32}, {"bfloat16", DType::bf16}}),
      choice_key<Device>("training.device", "cpu", [](TrainConfig& c) -> Device& { return c.training.device; },
                         {{"cpu", Device::cpu}, {"cuda", Device::cuda}}),
      choice_key<DType>("training.reduce_dtype", "float32",
                        [](TrainConfig& c) -> DType& { return c.training.reduce_dtype; },
                        {{"float32", DType::f32}, {"bfloat16", DType::bf16}}),
      bool_key(
          "training.skip_nonfinite", "false", [](TrainConfig& c) -> bool& { return c.training.skip_nonfinite; },
          "a step whose gradient norm is NaN or infinite is passed over (no update, counted in the metrics) instead of stopping the run"),
      choice_key<bool>(
          "training.fp8", "none", [](TrainConfig& c) -> bool& { return c.model.fp8.enabled; },
          {{"none", false}, {"tensorwise", true}},
          "tensorwise: the linear layers inside the transformer blocks (not the embedding, the LM head, "
          "a MoE router or the routed experts) run their three GEMMs on FP8 operands, each quantised "
          "with the scale of its own current amax (the whole tensor's, over every rank it is split "
          "across), products summed in float32; on CPUs exact for those operands"),
      choice_key<DType>(
          "training.fp8_format", "hybrid", [](TrainConfig& c) -> DType& { return c.model.fp8.grad_format; },
          {{"hybrid", DType::f8e5m2}, {"e4m3", DType::f8e4m3}},
          "hybrid: weights and activations E4M3, output gradients E5M2 (TransformerEngine's); "
          "e4m3: all three E4M3"),
      bool_key(
          "training.fp8_pow2_scale", "false", [](TrainConfig& c) -> bool& { return c.model.fp8.pow2_scale; },
          "each FP8 scale rounded down to a power of two"),
      bool_key(
          "training.fp8_all_gather", "false", [](TrainConfig& c) -> bool& { return c.model.fp8.all_gather; },
          "each FP8 layer's weight is quantised to E4M3 on its FSDP shard (with the whole weight's scale) before "
          "it is gathered: half the bytes of bfloat16"),
      name_list_key(
          "training.fp8_skip", "", [](TrainConfig& c) -> std::vector<std::string>& { return c.model.fp8.skip; },
          "a list of names: a linear layer whose name (its weight's Hugging Face name less .weight, e.g. "
          "model.layers.0.mlp.down_proj) holds one of them stays in training.dtype; []: none"),
      number_key<int64_t>(
          "training.grad_accum_steps", "1", [](TrainConfig& c) -> int64_t& { return c.training.grad_accum_steps; }, pos,
          "a positive integer (microbatches per step; data.batch_size must divide by it; with parallel.pp the "
          "schedule runs this many times a step over parallel.pp_microbatches each)"),
      string_key(
          "checkpoint.init_from", "", [](TrainConfig& c) -> std::string& { return c.checkpoint.init_from; },
          "a Hugging Face safetensors file the weights start from, when there is no checkpoint to resume from; \"\": the seeded initialisation"),
      string_key(
          "checkpoint.folder", "", [](TrainConfig& c) -> std::string& { return c.checkpoint.folder; },
          "where checkpoints go, a folder step_NNNNNN each (every rank's shards and metadata.json); a run resumes "
          "from the newest complete one there; \"\": none"),
      number_key<int64_t>(
          "checkpoint.interval", "0", [](TrainConfig& c) -> int64_t& { return c.checkpoint.interval; }, nonneg,
          "an integer >= 0: a checkpoint every this many steps and one after the last; 0: only after the last"),
      number_key<int64_t>(
          "checkpoint.load_step", "0", [](TrainConfig& c) -> int64_t& { return c.checkpoint.load_step; }, nonneg,
          "an integer >= 0: the step of checkpoint.folder to resume from; 0: the newest complete one; an older step "
          "rolls back (the later steps are moved to checkpoint.folder/abandoned_ID)"),
      number_key<int64_t>(
          "checkpoint.keep_latest_k", "0", [](TrainConfig& c) -> int64_t& { return c.checkpoint.keep_latest_k; },
          nonneg, "an integer >= 0: older checkpoints are deleted once this many are saved; 0: all kept"),
      bool_key(
          "checkpoint.async", "false", [](TrainConfig& c) -> bool& { return c.checkpoint.async; },
          "the loop only copies the state (into buffers kept for it: a second copy of this rank's state in memory) and a thread writes it while training goes on"),
      string_key(
          "checkpoint.export", "", [](TrainConfig& c) -> std::string& { return c.checkpoint.export_file; },
          "a Hugging Face safetensors file of the whole weights written after the last step; \"\": none "
          "(meshtrain export makes one from any checkpoint)"),
      string_key(
          "metrics.file", "", [](TrainConfig& c) -> std::string& { return c.metrics.file; },
          "a JSON-lines file of every step's metrics; \"\": none"),
      number_key<int64_t>(
          "metrics.log_every", "1", [](TrainConfig& c) -> int64_t& { return c.metrics.log_every; }, pos,
          "a positive integer: steps between progress lines"),
      string_key(
          "validation.path", "", [](TrainConfig& c) -> std::string& { return c.validation.path; },
          "the validation split, a file, directory or glob as data.path reads (e.g. meshtrain tokenize's "
          "OUT/val_*.bin): its loss, "
          "forward only on the training layout, is logged as val_loss; \"\": no validation"),
      number_key<int64_t>(
          "validation.every", "0", [](TrainConfig& c) -> int64_t& { return c.validation.every; }, nonneg,
          "an integer >= 0: a validation every this many steps and one after the last; 0: only after the last"),
      number_key<int64_t>(
          "validation.steps", "10", [](TrainConfig& c) -> int64_t& { return c.validation.steps; }, pos,
          "a positive integer: the batches (data.batch_size x data.seq_len tokens each) of a validation, the same "
          "ones each time, from the split's start (wrapping round a split shorter than that)"),
      number_key<int64_t>(
          "parallel.dp_replicate", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.dp_replicate; }, pos,
          "a positive integer"),
      number_key<int64_t>(
          "parallel.dp_shard", "-1", [](TrainConfig& c) -> int64_t& { return c.parallel.dp_shard; },
          [](int64_t v) { return v >= 1 || v == -1; }, "a positive integer or -1 (the ranks left over)"),
      number_key<int64_t>(
          "parallel.tp", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.tp; }, pos, "a positive integer"),
      number_key<int64_t>(
          "parallel.ep", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.ep; }, pos,
          "a positive integer dividing model.n_experts and parallel.dp_shard (or, with parallel.cp, cp times a "
          "divisor of it): expert parallelism, each MoE layer's experts split over this many of the dp_shard ranks "
          "(or of dp_shard x cp: every cp rank and ep / cp of dp_shard's), tokens sent to their experts' ranks and "
          "back by all_to_all"),
      number_key<int64_t>(
          "parallel.cp", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.cp; }, pos,
          "a positive integer: context parallelism, every activation split on the sequence over this many ranks "
          "(2 x cp must divide data.seq_len: each rank holds two load-balanced chunks); weights FSDP-sharded over "
          "dp_shard x cp"),
      choice_key<parallel::ParallelConfig::CpAttention>(
          "parallel.cp_attention", "auto",
          [](TrainConfig& c) -> parallel::ParallelConfig::CpAttention& { return c.parallel.cp_attention; },
          {{"allgather", parallel::ParallelConfig::CpAttention::allgather},
           {"ring", parallel::ParallelConfig::CpAttention::ring},
           {"auto", parallel::ParallelConfig::CpAttention::by_estimate}},
          "with parallel.cp > 1, how attention meets the keys of other cp ranks: allgather, each layer's keys and "
          "values all-gathered over cp; ring, passed around the cp ring while each block's attention runs, the "
          "partial results merged by their log-sum-exps; auto, whichever rank 0's step is estimated faster with "
          "on the [schedule] hardware profile (the estimate's --hardware)"),
      number_key<int64_t>(
          "parallel.expert_tp", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.expert_tp; }, pos,
          "1 or parallel.tp: the routed experts' weights also split Megatron-style over tp (1: whole on each tp "
          "rank)"),
      bool_key(
          "parallel.sequence_parallel", "false", [](TrainConfig& c) -> bool& { return c.parallel.sequence_parallel; },
          "the norms and residuals between tensor-parallel blocks are sharded along the sequence (Megatron SP)"),
      bool_key(
          "parallel.async_tp", "false", [](TrainConfig& c) -> bool& { return c.parallel.async_tp; },
          "with sequence_parallel: each all_gather over tp that feeds GEMMs, and each reduce_scatter of GEMMs' "
          "partial sums, runs as tp - 1 point-to-point steps, each step's transfer under the GEMM of the chunk "
          "already there (async TP); the same numbers but for the GEMMs on fewer rows, which may differ by an f32 "
          "ulp; not with cp > 1"),
      bool_key(
          "parallel.loss_parallel", "false", [](TrainConfig& c) -> bool& { return c.parallel.loss_parallel; },
          "with tp > 1 the logits stay sharded over the vocabulary and the loss is computed on the shards, never gathered"),
      bool_key(
          "parallel.reshard_after_forward", "true",
          [](TrainConfig& c) -> bool& { return c.parallel.reshard_after_forward; },
          "FSDP gathers each weight again for backward, so the gathered weights are freed between forward and backward; false: kept from forward to backward"),
      number_key<int64_t>(
          "parallel.pp", "1", [](TrainConfig& c) -> int64_t& { return c.parallel.pp; }, pos,
          "a positive integer: pipeline-parallel ranks, each running its stages of the model"),
      choice_key<parallel::PpScheduleKind>(
          "parallel.pp_schedule", "1f1b",
          [](TrainConfig& c) -> parallel::PpScheduleKind& { return c.parallel.pp_schedule; },
          {{"gpipe", parallel::PpScheduleKind::gpipe},
           {"1f1b", parallel::PpScheduleKind::one_f_one_b},
           {"interleaved_1f1b", parallel::PpScheduleKind::interleaved_1f1b},
           {"zero_bubble", parallel::PpScheduleKind::zero_bubble},
           {"zbv", parallel::PpScheduleKind::zbv}}),
      number_key<int64_t>(
          "parallel.pp_microbatches", "0", [](TrainConfig& c) -> int64_t& { return c.parallel.pp_microbatches; },
          nonneg,
          "an integer >= 0: microbatches a step's batch is cut into for the pipeline (data.batch_size must divide by it); 0: as many as there are stages"),
      number_key<int64_t>(
          "parallel.pp_stages_per_rank", "0", [](TrainConfig& c) -> int64_t& { return c.parallel.pp_stages_per_rank; },
          nonneg,
          "an integer >= 0: stages each pipeline rank holds (virtual stages); 0: 2 for interleaved_1f1b and zbv, else 1"),
      string_key(
          "parallel.pp_schedule_csv", "", [](TrainConfig& c) -> std::string& { return c.parallel.pp_schedule_csv; },
          "a file of one's own pipeline schedule, one line per pipeline rank of its compute actions in order "
          "(0F0,0F1,0I0,0W0,...; `meshtrain pp-schedule --csv` prints any schedule so), which then replaces "
          "pp_schedule and gives the stages per rank and microbatches; \"\": none"),
      number_key<int64_t>(
          "parallel.pp_max_active_stages", "0",
          [](TrainConfig& c) -> int64_t& { return c.parallel.pp_max_active_stages; }, nonneg,
          "an integer >= 0: with several stages per pipeline rank, at most this many have their "
          "weights gathered at once (each gathered just before its next use, looking ahead, and "
          "dropped when another is needed: less memory, more gathers); 0: all of a rank's, for the whole step"),
      bool_key(
          "parallel.pp_keep_backward_layouts", "false",
          [](TrainConfig& c) -> bool& { return c.parallel.pp_keep_backward_layouts; },
          "a pipeline stage also gathers, once a step with its forward's, its weights in the other layouts its "
          "backward reads, and holds them all step (more memory, no weight gathers per microbatch); false: the "
          "backward gathers those for every microbatch"),
      count_list_key(
          "parallel.pp_layers_per_stage", "",
          [](TrainConfig& c) -> std::vector<int64_t>& { return c.parallel.pp_layers_per_stage; },
          "a list of positive integers, one per stage, summing to model.n_layers + 2 (the embedding and the head count as one layer each); []: as even as can be"),
      number_key<double>(
          "comm.timeout_s", "600", [](TrainConfig& c) -> double& { return c.comm.timeout_s; },
          [](double v) { return v >= 0.1 && v <= 604800; },
          "seconds in [0.1, 604800]: a collective not finished after this long (a rank died or hangs) "
          "stops the job, naming it; every rank dumps its flight recorder to MESHTRAIN_FR_DIR "
          "(default ./meshtrain_fr) for meshtrain fr-analyze"),
      choice_key<sched::ActivationCheckpoint>(
          "activation_checkpoint.mode", "none",
          [](TrainConfig& c) -> sched::ActivationCheckpoint& { return c.activation_checkpoint.mode; },
          {{"none", sched::ActivationCheckpoint::none},
           {"full", sched::ActivationCheckpoint::full},
           {"selective", sched::ActivationCheckpoint::selective}}),
      choice_key<sched::SelectiveMatmuls>(
          "activation_checkpoint.selective_matmuls", "all",
          [](TrainConfig& c) -> sched::SelectiveMatmuls& { return c.activation_checkpoint.selective_matmuls; },
          {{"all", sched::SelectiveMatmuls::all}, {"every_other", sched::SelectiveMatmuls::every_other}}),
      choice_key<sched::BucketMode>("schedule.bucket_mode", "per_block",
                                    [](TrainConfig& c) -> sched::BucketMode& { return c.schedule.bucket_mode; },
                                    {{"none", sched::BucketMode::none},
                                     {"per_block", sched::BucketMode::per_block},
                                     {"size_cap", sched::BucketMode::size_cap},
                                     {"auto", sched::BucketMode::automatic}}),
      number_key<double>(
          "schedule.bucket_cap_mb", "25", [](TrainConfig& c) -> double& { return c.schedule.bucket_cap_mb; }, posf,
          "a positive number (MiB of a bucket's collective buffers per rank)"),
      bool_key(
          "schedule.bucket_views", "true", [](TrainConfig& c) -> bool& { return c.schedule.bucket_views; },
          "a bucket's members are views of the bucket where the memory plan can lay them out there (no copy "
          "in or out; a gradient bucket then holds its bytes from its first gradient on); false: they are "
          "copied in and out (as PyTorch DDP's gradient_as_bucket_view = False), so a bucket lives only "
          "around its collective but each copy holds the members and the bucket at once: the peak may go "
          "down or up"),
      bool_key(
          "schedule.reorder", "true", [](TrainConfig& c) -> bool& { return c.schedule.reorder; },
          "collectives start early, so that compute hides them"),
      number_key<int64_t>(
          "schedule.memory_budget_mb", "0", [](TrainConfig& c) -> int64_t& { return c.schedule.memory_budget_mb; },
          nonneg, "an integer >= 0 (MiB a rank's step may allocate; 0: no budget)"),
      string_key(
          "schedule.hardware", "auto", [](TrainConfig& c) -> std::string& { return c.schedule.hardware; },
          "the profile the passes cost the step on: auto (cpu-2core), a built-in name or a profile file"),
      choice_key<EstimateMode>("schedule.estimate", "roofline",
                               [](TrainConfig& c) -> EstimateMode& { return c.schedule.estimate; },
                               {{"roofline", EstimateMode::roofline}, {"benchmark", EstimateMode::benchmark}}),
      string_key(
          "schedule.kernel_cache", "", [](TrainConfig& c) -> std::string& { return c.schedule.kernel_cache; },
          "benchmark mode: a JSON file of kernel times, read first and written back; \"\": none"),
  };
  return table;
}

}  // namespace

TrainConfig::TrainConfig() {
  for (const Key& k : keys()) k.from_text(*this, k.default_text);
}

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (const auto& k : keys()) names.push_back(k.name);
  return names;
}

std::vector<std::pair<std::string, std::string>> config_values(const TrainConfig& config) {
  TrainConfig copy = config;  // show() reads through the same accessors that set
  std::vector<std::pair<std::string, std::string>> values;
  for (const Key& k : keys()) values.emplace_back(k.name, k.show(copy));
  return values;
}

std::string config_toml(const TrainConfig& config) {
  std::string out, section;
  for (const auto& [key, value] : config_values(config)) {
    const size_t dot = key.find('.');
    if (key.substr(0, dot) != section) {
      section = key.substr(0, dot);
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    out += fmt::format("{} = {}\n", key.substr(dot + 1), value);
  }
  return out;
}

std::vector<KeyDoc> config_key_docs() {
  std::vector<KeyDoc> docs;
  for (const auto& k : keys()) docs.push_back({k.name, k.default_text, k.expects});
  return docs;
}

std::string config_reference_markdown() {
  TrainConfig defaults;
  std::string out =
      "# Configuration reference\n\n"
      "<!-- Generated from the key table in src/config/config.cpp by scripts/config-reference.sh; a unit test "
      "fails when it drifts. Do not edit by hand. -->\n\n"
      "A training config is a TOML file of `[section]` tables (`configs/` holds examples). Every key can also be "
      "set on the command line as `--section.key value`, which wins over the file. An unknown key or a bad value "
      "is an error that names the key.\n";
  std::string section;
  for (const auto& k : keys()) {
    const std::string key_section = k.name.substr(0, k.name.find('.'));
    if (key_section != section) {
      section = key_section;
      out += fmt::format("\n## [{}]\n\n| key | default | value |\n|---|---|---|\n", section);
    }
    std::string expects = k.expects;
    for (size_t at = 0; (at = expects.find('|', at)) != std::string::npos; at += 2) expects.replace(at, 1, "\\|");
    out += fmt::format("| `{}` | `{}` | {} |\n", k.name.substr(section.size() + 1), k.show(defaults), expects);
  }
  return out;
}

namespace {
const Key& find_key(const std::string& name) {
  for (const auto& k : keys())
    if (k.name == name) return k;
  throw InvalidArgument(fmt::format("unknown config key '{}'; known keys: {}", name, fmt::join(config_keys(), ", ")));
}
}  // namespace

void apply_override(TrainConfig& config, const std::string& key, const std::string& value) {
  find_key(key).from_text(config, value);
}

TrainConfig load_config(const std::string& path, const std::vector<std::pair<std::string, std::string>>& overrides) {
  TrainConfig c;
  c.file = path;
  toml::table doc;
  MT_CHECK(std::filesystem::is_regular_file(path),
           "--config {}: {}; give the path of a TOML config file (configs/ "
           "holds examples)",
           path, std::filesystem::exists(path) ? "is not a file" : "does not exist");
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw InvalidArgument(
        fmt::format("cannot read config {}: {} (line {})", path, e.description(), e.source().begin.line));
  }
  for (const auto& [section, node] : doc) {
    const auto* table = node.as_table();
    MT_CHECK(table != nullptr, "config {}: top-level key '{}' must be a [section]", path, section.str());
    for (const auto& [key, value] : *table) {
      const std::string name = fmt::format("{}.{}", section.str(), key.str());
      try {
        find_key(name).from_toml(c, value);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("config {}: {}", path, e.what()));
      }
    }
  }
  for (const auto& [name, value] : overrides) apply_override(c, name, value);
  check_config(c);
  return c;
}

void check_config(TrainConfig& c) {
  c.model.validate();
  MT_CHECK(c.parallel.ep == 1 || c.model.n_experts > 0,
           "config: parallel.ep {} needs a mixture of experts to split (model.n_experts is 0)", c.parallel.ep);
  MT_CHECK(c.model.n_experts % c.parallel.ep == 0,
           "config: parallel.ep {} must divide model.n_experts {} (each expert-parallel rank holds as many experts)",
           c.parallel.ep, c.model.n_experts);
  MT_CHECK(c.parallel.expert_tp == 1 || c.parallel.expert_tp == c.parallel.tp,
           "config: parallel.expert_tp {} must be 1 or parallel.tp {}", c.parallel.expert_tp, c.parallel.tp);
  c.model.dispatch_blocks = c.parallel.ep;
  const int64_t cp = c.parallel.cp;
  MT_CHECK(cp == 1 || c.data.seq_len % (2 * cp) == 0,
           "config: data.seq_len {} must divide by 2 x parallel.cp ({}): context parallelism gives each rank two "
           "load-balanced chunks of the sequence",
           c.data.seq_len, 2 * cp);
  c.model.seq_chunks = cp > 1 ? 2 * cp : 1;
  c.set_cp_attention(c.parallel.cp_attention);
  MT_CHECK(!c.data.path.empty(), "config: data.path is not set");
  MT_CHECK(c.training.reduce_dtype == DType::f32 || c.training.dtype == DType::bf16,
           "config: training.reduce_dtype bfloat16 needs training.dtype bfloat16 (gradients are float32 otherwise)");
  // The largest activation a step holds, batch x seq x the widest of dim,
  // ffn_dim and vocab_size elements, must be addressable.
  const int64_t widest = std::max({c.model.dim, c.model.ffn_dim, c.model.vocab_size});
  int64_t tokens = 0, elements = 0;
  const bool overflow = __builtin_mul_overflow(c.data.batch_size, c.data.seq_len, &tokens) ||
                        __builtin_mul_overflow(tokens, widest, &elements);
  MT_CHECK(!overflow && elements <= Shape::kMaxElements,
           "config: data.batch_size {} x data.seq_len {} x {} (the widest of model.dim, model.ffn_dim and "
           "model.vocab_size) is more elements than a step can hold (over 2^56); lower them",
           c.data.batch_size, c.data.seq_len, widest);
  // The largest weight, model.dim x the widest: addressable too.
  int64_t weight_elements = 0;
  MT_CHECK(!__builtin_mul_overflow(c.model.dim, widest, &weight_elements) && weight_elements <= Shape::kMaxElements,
           "config: model.dim {} x {} (the widest of model.dim, model.ffn_dim and model.vocab_size) is more elements "
           "than a weight can hold (over 2^56); lower them",
           c.model.dim, widest);
  MT_CHECK(c.activation_checkpoint.selective_matmuls == sched::SelectiveMatmuls::all ||
               c.activation_checkpoint.mode == sched::ActivationCheckpoint::selective,
           "config: activation_checkpoint.selective_matmuls every_other applies to activation_checkpoint.mode "
           "selective, not {}; set the mode to selective or leave selective_matmuls at all",
           sched::activation_checkpoint_name(c.activation_checkpoint.mode));
  // The keys only a pipeline reads: set with parallel.pp 1, they would be ignored without a word.
  if (c.parallel.pp == 1) {
    TrainConfig given = c, defaults;
    for (const char* key :
         {"parallel.pp_schedule", "parallel.pp_microbatches", "parallel.pp_stages_per_rank", "parallel.pp_schedule_csv",
          "parallel.pp_max_active_stages", "parallel.pp_layers_per_stage", "parallel.pp_keep_backward_layouts"})
      MT_CHECK(find_key(key).show(given) == find_key(key).show(defaults),
               "config: {} = {} applies to a pipeline, but parallel.pp is 1 (no pipeline): set parallel.pp, or leave "
               "{} out",
               key, find_key(key).show(given), key);
  }
  if (c.model.n_experts == 0) {  // keys that would be ignored without a word
    TrainConfig given = c, defaults;
    for (const char* key : {"model.n_experts_per_token", "model.moe_ffn_dim", "model.first_dense_layers",
                            "model.n_shared_experts", "model.router_aux_loss_coef", "model.capacity_factor"})
      MT_CHECK(find_key(key).show(given) == find_key(key).show(defaults),
               "config: {} = {} applies to a mixture of experts, but model.n_experts is 0 (dense): set "
               "model.n_experts, or leave {} out",
               key, find_key(key).show(given), key);
  }
  if (!c.model.fp8.enabled) {  // keys that would be ignored without a word
    TrainConfig given = c, defaults;
    for (const char* key :
         {"training.fp8_format", "training.fp8_pow2_scale", "training.fp8_all_gather", "training.fp8_skip"})
      MT_CHECK(find_key(key).show(given) == find_key(key).show(defaults),
               "config: {} = {} applies to FP8 training, but training.fp8 is none: set training.fp8 tensorwise, or "
               "leave {} out",
               key, find_key(key).show(given), key);
  }
  MT_CHECK(c.training.device == Device::cpu || !c.model.fp8.enabled,
           "config: training.fp8 tensorwise with training.device {}: the FP8 GEMMs have CPU kernels only, for now",
           device_name(c.training.device));
  MT_CHECK(c.training.device == Device::cpu || c.model.n_experts == 0,
           "config: model.n_experts {} with training.device {}: the mixture-of-experts ops have CPU kernels only, "
           "for now",
           c.model.n_experts, device_name(c.training.device));
  if (c.validation.path.empty()) {  // keys that would be ignored without a word
    TrainConfig given = c, defaults;
    for (const char* key : {"validation.every", "validation.steps"})
      MT_CHECK(find_key(key).show(given) == find_key(key).show(defaults),
               "config: {} = {} applies to a validation, but validation.path is not set: set it, or leave {} out", key,
               find_key(key).show(given), key);
  }
  MT_CHECK(c.data.batch_size % c.training.grad_accum_steps == 0,
           "config: data.batch_size {} must divide by training.grad_accum_steps {} (microbatches of equal size)",
           c.data.batch_size, c.training.grad_accum_steps);
}

}  // namespace meshtrain::config
