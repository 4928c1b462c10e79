#include "cli/autoplan_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "autoplan/search.h"
#include "cli/command_args.h"
#include "core/error.h"
#include "core/file_io.h"
#include "models/llama.h"
#include "train/trainer.h"

namespace meshtrain::cli {

namespace {

double autoplan_gib(double bytes) { return bytes / (1ull << 30); }

std::string autoplan_duration(double us) {
  return us >= 1e6 ? fmt::format("{:.3f} s", us * 1e-6) : fmt::format("{:.1f} ms", us * 1e-3);
}

std::string autoplan_footer() {
  return "Search every plan that lays the config's step out on N ranks and print the fastest, each as the\n"
         "--section.key overrides that run it (`meshtrain train --config FILE OVERRIDES` under mpirun -np N).\n"
         "A plan is the [parallel] degrees dp_replicate x dp_shard x tp x cp x pp (x ep, experts over the\n"
         "dp_shard ranks, with expert_tp 1 or tp), with a pipeline its schedule (gpipe, 1f1b, interleaved_1f1b,\n"
         "zero_bubble, zbv) and microbatches, activation checkpointing (none, selective, selective every other\n"
         "matmul, full), gradient accumulation, and the communication options (reshard_after_forward, automatic\n"
         "bucketing, sequence and loss parallel, async TP, ring attention under cp_attention auto). The global\n"
         "batch, the model and the numerics are the config's: FP8 and bf16 gradient reduction are tried only\n"
         "with --vary-numerics.\n"
         "Each plan is costed by `meshtrain estimate` on rank 0 (the largest shards), in parallel on this host's\n"
         "cores. Each layout starts with nothing recomputed and goes down its memory ladder (selective, selective\n"
         "every other, full, then accumulation) to the first plan that fits the device's memory (--budget-gib\n"
         "instead), then keeps each communication option that makes it faster. A plan whose lower bound is no\n"
         "better than the K-th fastest step found is dropped uncosted: the whole step's graph costed node by\n"
         "node on one rank's peaks over the ranks (with a pipeline, its busiest rank's stages and the bubble),\n"
         "or the compute of the costed plan it changes. So is one whose master weights and optimizer states do\n"
         "not fit. So, too, is one\n"
         "whose step, extrapolated from estimates of the model with fewer layers (2 and 4, or per pipeline stage\n"
         "one and two more), is still no faster less 2%, or whose first such estimate alone is (--exhaustive:\n"
         "none is screened so).\n"
         "--json prints every plan costed and every plan dropped with its reason; --out FILE writes the fastest\n"
         "as a whole config (TOML). --max-seconds S stops the search and prints the best so far (estimates\n"
         "under way finish first). A progress line goes\n"
         "to stderr every 2 s. Exit 1 when no plan is legal or none fits (the message says what blocks\n"
         "them), 2 for bad options.\n";
}

nlohmann::json overrides_json(const std::vector<std::pair<std::string, std::string>>& overrides) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : overrides) out[key] = value;
  return out;
}

nlohmann::json costed_json(const autoplan::CostedPlan& c) {
  nlohmann::json out = {{"overrides", overrides_json(c.overrides)},
                        {"command_line", autoplan::overrides_text(c.overrides)},
                        {"tokens_per_s_per_device", c.tokens_per_s_per_device},
                        {"mfu", c.mfu},
                        {"step_us", c.step_us},
                        {"compute_us", c.compute_us},
                        {"exposed_us", c.exposed_us},
                        {"bubble_us", c.bubble_us},
                        {"peak_bytes", c.peak_bytes},
                        {"fits", c.fits},
                        {"estimate_seconds", c.estimate_seconds},
                        {"bound", c.bound}};
  if (c.screen_step_us > 0) out["screen_step_us"] = c.screen_step_us;  // --check-screen
  return out;
}

void print_json(const autoplan::SearchResult& r, int ranks, const sched::HardwareProfile& hardware, int top) {
  nlohmann::json costed = nlohmann::json::array(), dropped = nlohmann::json::array(), best = nlohmann::json::array();
  for (const auto& c : r.costed) costed.push_back(costed_json(c));
  for (const auto* c : r.best(top)) best.push_back(costed_json(*c));
  for (const auto& d : r.dropped)
    dropped.push_back(
        {{"overrides", overrides_json(d.overrides)},
         {"degrees", fmt::format("dp_replicate {} dp_shard {} tp {} cp {} pp {} ep {}", d.plan.dp_replicate,
                                 d.plan.dp_shard, d.plan.tp, d.plan.cp, d.plan.pp, d.plan.ep)},
         {"reason", d.reason}});
  const nlohmann::json doc{{"ranks", ranks},
                           {"hardware", hardware.name},
                           {"memory_limit_bytes", r.memory_limit_bytes},
                           {"layouts", r.layouts},
                           {"layouts_searched", r.layouts_searched},
                           {"complete", r.complete},
                           {"seconds", r.seconds},
                           {"best", best},
                           {"costed", costed},
                           {"dropped", dropped}};
  fmt::print("{}\n", doc.dump(1));
}

void print_table(const autoplan::SearchResult& r, const config::TrainConfig& base, int ranks,
                 const sched::HardwareProfile& hardware, int top) {
  fmt::print("meshtrain autoplan: {}; batch {} x seq {}, {} compute; {} ranks of {}{}\n", models::describe(base.model),
             base.data.batch_size, base.data.seq_len, dtype_name(base.training.dtype), ranks, hardware.name,
             r.memory_limit_bytes > 0 ? fmt::format(", {:.1f} GiB a rank", autoplan_gib(r.memory_limit_bytes)) : "");
  size_t fitting = 0;
  for (const auto& c : r.costed) fitting += c.fits;
  fmt::print("searched {} of {} layouts in {:.1f} s{}: {} plans costed ({} fit), {} dropped uncosted\n",
             r.layouts_searched, r.layouts, r.seconds, r.complete ? "" : " (stopped by --max-seconds)", r.costed.size(),
             fitting, r.dropped.size());
  fmt::print("{:>3} {:>12} {:>10} {:>6} {:>9} {:>10} {:>10}  {}\n", "#", "tokens/s/dev", "step", "MFU", "memory",
             "exposed", "bubble", "overrides");
  const auto best = r.best(top);
  for (size_t i = 0; i < best.size(); ++i) {
    const autoplan::CostedPlan& c = *best[i];
    // A plan whose option changed nothing (automatic bucketing that chose per-block) estimates as the one above.
    const bool same = i > 0 && c.step_us == best[i - 1]->step_us && c.peak_bytes == best[i - 1]->peak_bytes;
    fmt::print("{:>3} {:>12.0f} {:>10} {:>5.1f}% {:>5.1f} GiB {:>10} {:>10}  {}{}\n", i + 1, c.tokens_per_s_per_device,
               autoplan_duration(c.step_us), 100 * c.mfu, autoplan_gib(c.peak_bytes),
               autoplan_duration(std::max(0.0, c.exposed_us - c.bubble_us)), autoplan_duration(c.bubble_us),
               c.overrides.empty() ? "(the config as it is)" : autoplan::overrides_text(c.overrides),
               same ? fmt::format(" (estimated as #{})", i) : "");
  }
  fmt::print("the fastest plan is bound by {}\n", r.best(1).front()->bound);
}

}  // namespace

int run_autoplan(const CommandArgs& a);

Command add_autoplan_command(CLI::App& app) {
  auto args = std::make_shared<CommandArgs>();
  CLI::App* autoplan = app.add_subcommand(
      "autoplan",
      "Search the layouts of a config's step on N ranks (parallel degrees, pipeline schedules, activation "
      "checkpointing, communication options) by their estimates and print the fastest that fit: meshtrain "
      "autoplan --config FILE --ranks N --hardware NAME|FILE [--top K] [--json] [--out BEST.toml]");
  autoplan->footer(autoplan_footer());
  add_engine_options(
      *autoplan, *args,
      {{"ranks", "N", "The job's ranks", true},
       {"hardware", "NAME|FILE", "A built-in hardware profile or a profile file", true},
       {"top", "K", "The plans to print (default 10)"},
       {"out", "FILE", "Write the fastest plan as a whole config (TOML)"},
       {"budget-gib", "G", "A rank's memory at most this (default: the profile's device memory)"},
       {"max-seconds", "S", "Stop costing after this long and print the best so far"},
       {"threads", "T", "Estimates at once (default: this host's cores)"}},
      {{"json", "", "Print one JSON document instead: every plan costed and every plan dropped"},
       {"vary-numerics", "", "Also try training.fp8 tensorwise and training.reduce_dtype bfloat16"},
       {"exhaustive", "", "Estimate every plan in full: no screen by estimates with fewer layers"},
       {"check-screen", "", "With --json: estimate every plan in full and give each its screen's step too"}});
  return {autoplan, [args] { return run_autoplan(*args); }};
}

int run_autoplan(const CommandArgs& a) {
  check_no_unexpected(a, "autoplan");
  const int64_t ranks = integer_option(a, "autoplan", "ranks", 1);
  MT_CHECK(ranks >= 1 && ranks <= compile::kMaxLaidOutRanks, "autoplan: --ranks {} must be between 1 and {}", ranks,
           compile::kMaxLaidOutRanks);
  autoplan::SearchOptions options;
  const int64_t top = integer_option(a, "autoplan", "top", 10), threads = integer_option(a, "autoplan", "threads", 0);
  MT_CHECK(top >= 1 && top <= 1000, "autoplan: --top {} must be between 1 and 1000", top);
  MT_CHECK(threads >= 0 && threads <= 1024, "autoplan: --threads {} must be between 0 (the cores) and 1024", threads);
  options.top = static_cast<int>(top);
  options.threads = static_cast<int>(threads);
  options.budget_gib = number_option(a, "autoplan", "budget-gib", 0);
  options.max_seconds = number_option(a, "autoplan", "max-seconds", 0);
  for (const auto& [key, value] : {std::pair{"budget-gib", options.budget_gib}, {"max-seconds", options.max_seconds}})
    MT_CHECK(value >= 0 && value < 1e9, "autoplan: --{} {} must be a positive number (0: none)", key, value);
  options.space.vary_fp8 = options.space.vary_reduce_dtype = a.flags.count("vary-numerics") > 0;
  options.screen = a.flags.count("exhaustive") == 0;
  options.check_screen = a.flags.count("check-screen") > 0;
  const sched::HardwareProfile hardware = sched::load_hardware(a.options.at("hardware"));
  const config::TrainConfig base = config::load_config(a.options.at("config"), a.overrides);
  const auto out = a.options.find("out");
  if (out != a.options.end()) {
    train::check_output_path(base, out->second, "--out");
    check_not_an_input(out->second, "--out", {{a.options.at("hardware"), "the --hardware profile"}});
    check_output_file(out->second, "--out");  // before the search, not after it
  }
  options.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  autoplan::SearchResult result;
  try {
    result = autoplan::search_plans(base, static_cast<int>(ranks), hardware, options);
  } catch (const InvalidArgument& e) {  // no plan: a result of the search, not a bad option
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  }
  if (a.flags.count("json"))
    print_json(result, static_cast<int>(ranks), hardware, options.top);
  else
    print_table(result, base, static_cast<int>(ranks), hardware, options.top);
  if (out != a.options.end()) {
    const config::TrainConfig best = autoplan::apply_plan(base, result.best(1).front()->plan, static_cast<int>(ranks));
    write_text(out->second, fmt::format("# meshtrain autoplan --ranks {} --hardware {}: the fastest plan found\n{}",
                                        ranks, hardware.name, config::config_toml(best)));
    if (!a.flags.count("json")) fmt::print("wrote the fastest plan to {}\n", out->second);
  }
  return 0;
}

}  // namespace meshtrain::cli
