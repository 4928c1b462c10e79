// libFuzzer target: a training config (config::load_config). The input up to
// its first NUL byte is the TOML file; after it, lines "section.key=value"
// are command-line overrides. A config it accepts must print and read back:
// every key printed with the value it holds (config::config_values, "as TOML
// writes it"; no other printer of a whole config exists) as a TOML file of
// [section] tables, which load_config must read with no error at all into the
// same config, member by member, that prints the same text again. The one
// exception: a string key set on the command line to bytes that are not
// UTF-8, which TOML cannot hold; reading that text back may fail (clearly).
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

namespace {

// The config as a TOML file: a [section] table per section, in key order.
std::string printed(const config::TrainConfig& c) {
  std::string out, section;
  for (const auto& [name, value] : config::config_values(c)) {
    const size_t dot = name.find('.');
    if (name.substr(0, dot) != section) {
      section = name.substr(0, dot);
      out += "\n[" + section + "]\n";
    }
    out += name.substr(dot + 1) + " = " + value + "\n";
  }
  return out;
}

// Every member of a TrainConfig but `file` (where it was read from).
bool same(const config::TrainConfig& a, const config::TrainConfig& b) {
  const auto &m = a.model, &n = b.model;
  const auto &p = a.parallel, &q = b.parallel;
  return m.dim == n.dim && m.n_layers == n.n_layers && m.n_heads == n.n_heads && m.n_kv_heads == n.n_kv_heads &&
         m.ffn_dim == n.ffn_dim && m.vocab_size == n.vocab_size && m.norm_eps == n.norm_eps &&
         m.rope_theta == n.rope_theta && m.tie_embeddings == n.tie_embeddings && a.data.path == b.data.path &&
         a.data.seq_len == b.data.seq_len && a.data.batch_size == b.data.batch_size &&
         a.optimizer.lr == b.optimizer.lr && a.optimizer.beta1 == b.optimizer.beta1 &&
         a.optimizer.beta2 == b.optimizer.beta2 && a.optimizer.eps == b.optimizer.eps &&
         a.optimizer.weight_decay == b.optimizer.weight_decay && a.optimizer.state_dtype == b.optimizer.state_dtype &&
         a.lr_scheduler.warmup_steps == b.lr_scheduler.warmup_steps && a.lr_scheduler.decay == b.lr_scheduler.decay &&
         a.lr_scheduler.min_lr_ratio == b.lr_scheduler.min_lr_ratio && a.training.steps == b.training.steps &&
         a.training.seed == b.training.seed && a.training.max_grad_norm == b.training.max_grad_norm &&
         a.training.dtype == b.training.dtype && a.training.device == b.training.device &&
         a.training.grad_accum_steps == b.training.grad_accum_steps &&
         a.training.reduce_dtype == b.training.reduce_dtype && a.training.skip_nonfinite == b.training.skip_nonfinite &&
         a.checkpoint.init_from == b.checkpoint.init_from && a.checkpoint.folder == b.checkpoint.folder &&
         a.checkpoint.interval == b.checkpoint.interval && a.checkpoint.load_step == b.checkpoint.load_step &&
         a.checkpoint.keep_latest_k == b.checkpoint.keep_latest_k &&
         a.checkpoint.export_file == b.checkpoint.export_file && a.checkpoint.async == b.checkpoint.async &&
         a.metrics.file == b.metrics.file && a.metrics.log_every == b.metrics.log_every &&
         a.validation.path == b.validation.path && a.validation.every == b.validation.every &&
         a.validation.steps == b.validation.steps && p.dp_replicate == q.dp_replicate && p.dp_shard == q.dp_shard &&
         p.tp == q.tp && p.sequence_parallel == q.sequence_parallel && p.loss_parallel == q.loss_parallel &&
         p.reshard_after_forward == q.reshard_after_forward && p.pp == q.pp && p.pp_schedule == q.pp_schedule &&
         p.pp_microbatches == q.pp_microbatches && p.pp_stages_per_rank == q.pp_stages_per_rank &&
         p.pp_max_active_stages == q.pp_max_active_stages && p.pp_layers_per_stage == q.pp_layers_per_stage &&
         p.pp_schedule_csv == q.pp_schedule_csv && a.comm.timeout_s == b.comm.timeout_s &&
         a.activation_checkpoint.mode == b.activation_checkpoint.mode &&
         a.activation_checkpoint.selective_matmuls == b.activation_checkpoint.selective_matmuls &&
         a.schedule.bucket_mode == b.schedule.bucket_mode && a.schedule.bucket_cap_mb == b.schedule.bucket_cap_mb &&
         a.schedule.bucket_views == b.schedule.bucket_views && a.schedule.reorder == b.schedule.reorder &&
         a.schedule.memory_budget_mb == b.schedule.memory_budget_mb && a.schedule.hardware == b.schedule.hardware &&
         a.schedule.estimate == b.schedule.estimate && a.schedule.kernel_cache == b.schedule.kernel_cache;
}

// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
bool is_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    uint32_t code = length == 1 ? c : c & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 2) return false;
      code = code << 6 | (next & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < least[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

// TOML text is UTF-8: a string key set (on the command line) to other bytes has no TOML form.
bool strings_are_utf8(const config::TrainConfig& c) {
  for (const std::string* s :
       {&c.data.path, &c.checkpoint.init_from, &c.checkpoint.folder, &c.checkpoint.export_file, &c.metrics.file,
        &c.validation.path, &c.parallel.pp_schedule_csv, &c.schedule.hardware, &c.schedule.kernel_cache})
    if (!is_utf8(*s)) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fuzz::as_text(data, size);
  const size_t nul = input.find('\0');
  const std::string path = fuzz::write_input("config.toml", input.substr(0, nul));
  std::vector<std::pair<std::string, std::string>> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      const std::string_view line = rest.substr(0, end);
      const size_t eq = line.find('=');
      if (eq != std::string_view::npos) overrides.emplace_back(line.substr(0, eq), line.substr(eq + 1));
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  config::TrainConfig config;
  try {
    config = config::load_config(path, overrides);
  } catch (const meshtrain::Error&) {
    return 0;  // refused, with a clear error
  }
  fuzz::require(config.data.batch_size >= 1 && config.data.seq_len >= 1 && !config.data.path.empty());
  const std::string text = printed(config);
  config::TrainConfig back;
  try {
    back = config::load_config(fuzz::write_input("printed.toml", text), {});
  } catch (const meshtrain::Error&) {
    fuzz::require(!strings_are_utf8(config));  // the one config the printed text cannot hold
    return 0;
  }
  fuzz::require(same(back, config));
  fuzz::require(printed(back) == text);
  return 0;
}
