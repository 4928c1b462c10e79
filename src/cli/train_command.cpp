#include "cli/train_command.h"

#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "comm/mpi_backend.h"
#include "train/trainer.h"

namespace meshtrain::cli {

std::string train_help() {
  return fmt::format(
      "meshtrain train --config FILE [--section.key value ...]\n"
      "Train a Llama from a TOML config; any key can be overridden on the command line. Under mpirun the\n"
      "step is laid out on the mesh of the [parallel] keys (dp_replicate x dp_shard x tp = ranks; DDP, FSDP, HSDP)\n"
      "and every rank runs its part; rank 0 prints and writes metrics and checkpoints\n"
      "(--optimizer.lr 1e-3 or --optimizer.lr=1e-3). --profile prints the time of each op after training\n"
      "(summed over all steps but the first), with GFLOP/s and GB/s by the ops' FLOP and byte counts. Keys: {}\n",
      fmt::join(train::config_keys(), ", "));
}

namespace {
void print_profile(const std::vector<runtime::Executor::OpTime>& ops) {
  double total = 0;
  for (const auto& t : ops) total += t.seconds;
  if (total <= 0) {
    fmt::print("profile: nothing timed (profiling starts at step 2)\n");
    return;
  }
  fmt::print("profile (steps 2..): {:<22} {:>8} {:>10} {:>7} {:>9} {:>7}\n", "op", "calls", "ms", "share", "GFLOP/s",
             "GB/s");
  auto rate = [](double amount, double seconds) { return seconds > 0 ? amount / seconds * 1e-9 : 0.0; };
  for (const auto& t : ops)
    fmt::print("                     {:<22} {:>8} {:>10.1f} {:>6.1f}% {:>9.1f} {:>7.1f}\n", t.op, t.calls,
               t.seconds * 1e3, 100 * t.seconds / total, rate(t.flops, t.seconds), rate(t.bytes, t.seconds));
}
}  // namespace

int run_train(const std::vector<std::string>& args) {
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> overrides;
  bool profile = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      fmt::print("{}", train_help());
      return 0;
    }
    if (a == "--profile") {
      profile = true;
      continue;
    }
    MT_CHECK(a.rfind("--", 0) == 0, "train: unexpected argument '{}'; options look like --config FILE or --section.key value", a);
    std::string key = a.substr(2), value;
    if (const auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      MT_CHECK(i + 1 < args.size(), "train: option --{} needs a value", key);
      value = args[++i];
    }
    if (key == "config") config_path = value;
    else overrides.emplace_back(key, value);
  }
  MT_CHECK(!config_path.empty(), "train: --config FILE is required\n{}", train_help());
  // Under mpirun every rank reads the same config and checks it the same way
  // before any rank talks to another: rank 0 reports a bad one, and every
  // rank exits.
  const comm::LaunchedRank launched = comm::launched_rank();
  train::TrainConfig config;
  try {
    config = train::load_config(config_path, overrides);
    if (launched.size > 1) train::check_parallel_config(config, launched.size);
  } catch (const std::exception&) {
    if (launched.rank != 0) return 2;
    throw;
  }
  comm::ProcessGroupPtr world;
  if (launched.size > 1) world = comm::create_mpi_world();
  train::Trainer trainer(std::move(config), world);
  const auto& c = trainer.config();
  const bool printer = trainer.rank() == 0;
  if (!printer) {
    trainer.run(nullptr);
    return 0;
  }
  fmt::print("meshtrain train: Llama dim {} x {} layers, {} heads ({} kv), ffn {}, vocab {}: {:.2f}M parameters\n",
             c.model.dim, c.model.n_layers, c.model.n_heads, c.model.n_kv_heads, c.model.ffn_dim, c.model.vocab_size,
             static_cast<double>(trainer.parameter_count()) / 1e6);
  fmt::print("data {} (batch {} x seq {}), {} steps, AdamW lr {} wd {}, clip {}, {} rank{}, {} compute, {:.1f} GFLOP/step{}\n",
             c.data.path, c.data.batch_size, c.data.seq_len, c.training.steps, c.optimizer.lr, c.optimizer.weight_decay,
             c.training.max_grad_norm, trainer.num_ranks(), trainer.num_ranks() > 1 ? "s" : "",
             dtype_name(c.training.dtype), trainer.flops_per_step() / 1e9, trainer.num_ranks() > 1 ? " on rank 0" : "");
  if (trainer.num_ranks() > 1) fmt::print("layout: {}\n", trainer.layout_summary());
  std::fflush(stdout);
  trainer.set_profiling(profile);
  const auto summary = trainer.run(stdout);
  fmt::print("done: loss {:.4f} -> {:.4f} over {} steps, {:.0f} tokens/s at the last step, peak memory {:.1f} MiB\n",
             summary.first.loss, summary.last.loss, c.training.steps, summary.last.tokens_per_s,
             static_cast<double>(summary.last.peak_bytes) / (1 << 20));
  if (!c.metrics.file.empty()) fmt::print("metrics: {}\n", c.metrics.file);
  if (profile) print_profile(trainer.profile());
  return 0;
}

}  // namespace meshtrain::cli
