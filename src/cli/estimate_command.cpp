#include "cli/estimate_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/command_args.h"
#include "core/error.h"
#include "core/file_io.h"
#include "estimate/estimate.h"
#include "models/llama.h"
#include "train/trainer.h"

namespace meshtrain::cli {

namespace {

double gib(double bytes) { return bytes / (1ull << 30); }

std::string binary_amount(double bytes) {
  return bytes >= (1ull << 30) ? fmt::format("{:.2f} GiB", gib(bytes)) : fmt::format("{:.1f} MiB", bytes / (1 << 20));
}

std::string duration(double us) {
  return us >= 1e6   ? fmt::format("{:.3f} s", us * 1e-6)
         : us >= 1e3 ? fmt::format("{:.2f} ms", us * 1e-3)
                     : fmt::format("{:.1f} us", us);
}

double max_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024;  // Linux: KiB
}

// What `meshtrain estimate --help` says after the options.
std::string estimate_footer() {
  return fmt::format(
      "Cost the config's training step for an N-rank job without running it: the step is built, laid out on the\n"
      "mesh of its [parallel] keys and lowered for rank R (default 0; the torch.chunk rule gives rank 0 the\n"
      "largest shards) exactly as `mpirun -np N meshtrain train` would, then scheduled. Nothing is allocated and\n"
      "no rank is contacted: the lowered graph holds every collective the rank would run.\n"
      "Prints the rank's peak memory (what the executor allocates: the step's inputs and the memory plan's arena)\n"
      "with what is live at the peak by kind, the step time (a compute stream and one communication stream per\n"
      "group of mesh dims: each node by the roofline of its FLOPs and bytes on the profile, each collective by\n"
      "the profile's cost model), the communication the compute does not hide (exposed), tokens/s per device\n"
      "and MFU = F x tokens/s per device / the device's peak in the compute dtype, where F is torchtitan's\n"
      "FLOPs per token: 6 x (parameters - token embedding) + 12 x layers x heads x head_dim x seq_len.\n"
      "With --parallel.pp P (pipeline): every stage's forward and backward of one microbatch is laid out on its\n"
      "ranks and costed, the schedule is simulated with each stage's costs and the point-to-point time between\n"
      "stages (the bubble is in the exposed time), and the rank's once-a-step gather, gradient reduction and\n"
      "update follow; memory holds the activations of the microbatches in flight at the simulated peak.\n"
      "--hardware: a built-in profile ({}) or a profile file (TOML). Required: name, [device] peak_gflops_f32\n"
      "and memory_gbps. Optional: description; [device] peak_gflops_bf16 (default: the f32 peak), peak_gflops_fp8\n"
      "(the FP8 GEMMs', training.fp8; default: the peak of their output's dtype), memory_gib (0:\n"
      "unknown, no fit check), compute_efficiency and memory_efficiency (fractions of the peaks in (0, 1], 0.75\n"
      "each by default, PyTorch's roofline), devices_per_host (8), shared_host (false: CPU ranks sharing one\n"
      "host's peaks), cores (shared_host: the host's; a pipeline stage computing while others wait gets up to\n"
      "its threads' cores); [device.op_efficiency] OP = fraction, for ops by name; [device.op_call_us] OP =\n"
      "microseconds, an op's fixed time per call beyond its FLOPs (a rank of a shared host pays it over its\n"
      "share); [collectives] model = \"nccl\"\n"
      "(the default: arch hopper, intra_bus_gbps 370, inter_gbps 50, channels 16, amd_host false) or\n"
      "\"measured\" ([[collectives.table]] op, ranks, world, bytes = [...], us = [...]). Numbers outside\n"
      "1e-6..1e12 are refused. bench/calibrate.sh writes one for the machine it runs on.\n"
      "--schedule.estimate benchmark (with a profile of this machine: shared_host) costs each compute node by its\n"
      "kernel timed here on fresh tensors of its shapes instead (as a rank of the job would run it: its threads,\n"
      "its share of the cores), reading and writing the times in --schedule.kernel_cache FILE when given; a\n"
      "cache that `meshtrain train` wrote in benchmark mode holds the times its ranks measured side by side.\n"
      "On a shared host a collective also waits for its group's slowest rank: by the profile's\n"
      "[[device.sync_lateness]] (world, ranks, interval_us = [...], share = [...]: in a job of `world` ranks, a\n"
      "group of `ranks` trails by share x the compute since the rank last waited; bench/calibrate.sh measures\n"
      "it), and with --schedule.estimate benchmark by what `meshtrain train` in benchmark mode measured, its\n"
      "ranks side by side, and kept in --schedule.kernel_cache, over the profile's; with neither, by nothing.\n"
      "--json prints one JSON document instead; --trace FILE writes the estimated timeline as a Chrome trace\n"
      "(Perfetto, chrome://tracing), drawn as `meshtrain train --trace` draws a measured one.\n",
      fmt::join(sched::builtin_hardware_names(), ", "));
}

}  // namespace

int run_estimate(const CommandArgs& a);

Command add_estimate_command(CLI::App& app) {
  auto args = std::make_shared<CommandArgs>();
  CLI::App* estimate = app.add_subcommand(
      "estimate",
      "Estimate a training step's memory, time, tokens/s and MFU for an N-rank job on a hardware profile "
      "without running it: meshtrain estimate --config FILE --ranks N --hardware NAME|FILE [--json] "
      "[--trace FILE]");
  estimate->footer(estimate_footer());
  add_engine_options(*estimate, *args,
                     {{"ranks", "N", "The job's ranks", true},
                      {"rank", "R", "The rank whose step to cost (default 0)"},
                      {"hardware", "NAME|FILE", "A built-in hardware profile or a profile file", true},
                      {"trace", "FILE", "Write the estimated timeline as a Chrome trace"}},
                     {{"json", "", "Print one JSON document instead"}});
  return {estimate, [args] { return run_estimate(*args); }};
}

int run_estimate(const CommandArgs& a) {
  check_no_unexpected(a, "estimate");
  const auto started = std::chrono::steady_clock::now();
  const int64_t ranks = integer_option(a, "estimate", "ranks", 1), rank = integer_option(a, "estimate", "rank", 0);
  MT_CHECK(ranks >= 1 && ranks <= compile::kMaxLaidOutRanks,
           "estimate: --ranks {} must be between 1 and {} (the estimate lists each group's ranks: its time and memory "
           "grow with them)",
           ranks, compile::kMaxLaidOutRanks);
  MT_CHECK(rank >= 0 && rank < ranks, "estimate: --rank {} is outside the {} ranks (0..{})", rank, ranks, ranks - 1);
  const sched::HardwareProfile hardware = sched::load_hardware(a.options.at("hardware"));
  const config::TrainConfig config = config::load_config(a.options.at("config"), a.overrides);
  const auto trace_path = a.options.find("trace");
  if (trace_path != a.options.end()) {
    train::check_output_path(config, trace_path->second, "--trace");
    check_not_an_input(trace_path->second, "--trace", {{a.options.at("hardware"), "the --hardware profile"}});
    write_text(trace_path->second, "");  // fails now if it cannot be written
  }
  const estimate::TrainingEstimate e = estimate::estimate_training(
      config, static_cast<int>(ranks), static_cast<int>(rank), hardware, trace_path != a.options.end());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double resident = max_resident_bytes();
  const bool fits = hardware.memory_gib <= 0 || gib(e.memory.peak_bytes) <= hardware.memory_gib;
  const auto& m = config.model;

  if (trace_path != a.options.end()) write_text(trace_path->second, e.trace);
  if (a.flags.count("json")) {
    nlohmann::json kinds = nlohmann::json::object();
    for (const auto& [kind, bytes] : e.memory.at_peak) kinds[sched::memory_kind_name(kind)] = bytes;
    kinds["arena unused"] = e.memory.arena_unused_at_peak;
    const nlohmann::json doc{{"ranks", e.world_size},
                             {"rank", e.rank},
                             {"mesh", e.mesh},
                             {"cp_attention", e.cp_attention},
                             {"hardware", hardware.name},
                             {"nodes", e.nodes},
                             {"collectives", e.collectives},
                             {"collective_bytes", e.collective_bytes},
                             {"memory",
                              {{"peak_bytes", e.memory.peak_bytes},
                               {"allocated_bytes", e.memory.allocated_bytes},
                               {"input_bytes", e.memory.input_bytes},
                               {"arena_bytes", e.memory.arena_bytes},
                               {"at_peak", kinds},
                               {"peak_step", e.memory.peak_step},
                               {"device_bytes", hardware.memory_gib * (1ull << 30)},
                               {"fits", fits}}},
                             {"time",
                              {{"step_us", e.time.step_us},
                               {"compute_us", e.time.compute_us},
                               {"communication_us", e.time.communication_us},
                               {"exposed_us", e.time.exposed_us},
                               {"waiting_us", e.time.waiting_us}}},
                             {"tokens_per_step", e.tokens_per_step},
                             {"tokens_per_s_per_device", e.tokens_per_s_per_device},
                             {"flops_per_token", e.flops_per_token},
                             {"peak_gflops", e.peak_gflops},
                             {"mfu", e.mfu},
                             {"estimate_seconds", seconds},
                             {"max_resident_bytes", resident}};
    nlohmann::json out = doc;
    if (e.pipeline) {
      const estimate::PipelineEstimate& p = *e.pipeline;
      out["pipeline"] = {{"schedule", p.schedule},
                         {"stages", p.stages},
                         {"stages_per_rank", p.stages_per_rank},
                         {"microbatches", p.microbatches},
                         {"runs_per_step", p.runs},
                         {"forward_us", p.forward_us},
                         {"backward_input_us", p.backward_input_us},
                         {"backward_weight_us", p.backward_weight_us},
                         {"p2p_us", p.p2p_us},
                         {"makespan_us", p.makespan_us},
                         {"copy_us", p.copy_us},
                         {"bubble_fraction", p.bubble_fraction},
                         {"published_bubble_fraction", p.published_bubble},
                         {"unshard_us", p.unshard_us},
                         {"reduce_grad_us", p.reduce_grad_us},
                         {"update_us", p.update_us},
                         {"peak_activation_pairs", p.peak_activation_pairs},
                         {"activation_bytes_per_pair", p.activation_bytes_per_pair},
                         {"fullest_peak_bytes", p.fullest_peak_bytes},
                         {"fullest_rank", p.fullest_rank}};
    }
    fmt::print("{}\n", out.dump(1));
  } else {
    fmt::print("meshtrain estimate: {}; batch {} x seq {} ({:.0f} tokens/step), {} compute\n", models::describe(m),
               config.data.batch_size, config.data.seq_len, e.tokens_per_step, dtype_name(config.training.dtype));
    fmt::print("job: {} rank{} of {} ({}){}; rank {}'s step: {} nodes, {} collectives moving {} per step\n", ranks,
               ranks > 1 ? "s" : "", hardware.name, hardware.description,
               e.mesh.empty() ? "" : fmt::format(", mesh {}", e.mesh), e.rank, e.nodes, e.collectives,
               binary_amount(e.collective_bytes));
    if (!e.cp_attention.empty()) fmt::print("{}\n", e.cp_attention);
    fmt::print("memory: peak {}{} (inputs {}, arena {}); live at the peak:\n", binary_amount(e.memory.peak_bytes),
               hardware.memory_gib > 0
                   ? fmt::format(" of the device's {:.1f} GiB{}", hardware.memory_gib, fits ? "" : ": DOES NOT FIT")
                   : "",
               binary_amount(e.memory.input_bytes), binary_amount(e.memory.arena_bytes));
    for (const auto& [kind, bytes] : e.memory.at_peak)
      fmt::print("  {:<22} {:>12} ({:4.1f}%)\n", sched::memory_kind_name(kind), binary_amount(bytes),
                 100 * bytes / e.memory.peak_bytes);
    fmt::print("  {:<22} {:>12} ({:4.1f}%)\n", "arena unused", binary_amount(e.memory.arena_unused_at_peak),
               100 * e.memory.arena_unused_at_peak / e.memory.peak_bytes);
    if (e.pipeline && e.pipeline->fullest_rank != e.rank)
      fmt::print("  the pipeline's fullest rank: {}, peak {}{}\n", e.pipeline->fullest_rank,
                 binary_amount(e.pipeline->fullest_peak_bytes),
                 hardware.memory_gib > 0 && e.pipeline->fullest_peak_bytes > hardware.memory_gib * (1ull << 30)
                     ? ": DOES NOT FIT"
                     : "");
    fmt::print("time: step {}: compute {}, communication {} of which exposed {}{}{}\n", duration(e.time.step_us),
               duration(e.time.compute_us), duration(e.time.communication_us), duration(e.time.exposed_us),
               e.pipeline ? " (with the bubble)" : "",
               e.time.waiting_us > 0
                   ? fmt::format(", waiting for a group's slowest rank {}", duration(e.time.waiting_us))
                   : "");
    if (e.pipeline) {
      const estimate::PipelineEstimate& p = *e.pipeline;
      double f = 0, b = 0, p2p = 0;
      for (size_t s = 0; s < p.forward_us.size(); ++s) {
        f = std::max(f, p.forward_us[s]);
        b = std::max(b, p.backward_input_us[s] + p.backward_weight_us[s]);
        p2p = std::max(p2p, p.p2p_us[s]);
      }
      fmt::print(
          "pipeline: {} over {} stages ({} per rank), {} microbatches: the schedule takes {}{}, bubble {:.1f}% "
          "of it{}; a stage's microbatch at most F {} B {}, p2p {}; the runner's copies {} a step; this rank's "
          "stages once a step: gather {}, reduce gradients {}, update {}; activations of {} (stage, microbatch) "
          "pairs at the peak, {} each at most\n",
          p.schedule, p.stages, p.stages_per_rank, p.microbatches, duration(p.makespan_us),
          p.runs > 1 ? fmt::format(", run {} times a step (training.grad_accum_steps)", p.runs) : "",
          100 * p.bubble_fraction,
          p.published_bubble >= 0 ? fmt::format(" (published formula {:.1f}%)", 100 * p.published_bubble) : "",
          duration(f), duration(b), duration(p2p), duration(p.copy_us), duration(p.unshard_us),
          duration(p.reduce_grad_us), duration(p.update_us), p.peak_activation_pairs,
          binary_amount(p.activation_bytes_per_pair));
    }
    const double tokens_per_s = e.tokens_per_s_per_device;  // a step of hours still shows its rate
    fmt::print(
        "throughput: {} tokens/s per device; {:.3g} GFLOP/token (torchtitan's formula); MFU {:.1f}% of "
        "{}\n",
        tokens_per_s >= 100 ? fmt::format("{:.0f}", tokens_per_s) : fmt::format("{:.3g}", tokens_per_s),
        e.flops_per_token * 1e-9, 100 * e.mfu,
        e.peak_gflops >= 1e3 ? fmt::format("{:.1f} TFLOP/s", e.peak_gflops * 1e-3)
                             : fmt::format("{:.1f} GFLOP/s (the rank's share)", e.peak_gflops));
    fmt::print("estimated in {:.2f} s, {} resident at most\n", seconds, binary_amount(resident));
    if (trace_path != a.options.end())
      fmt::print("estimated trace: {} (open in https://ui.perfetto.dev or chrome://tracing)\n", trace_path->second);
  }
  return 0;
}

}  // namespace meshtrain::cli
