#include "cli/train_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "checkpoint/safetensors.h"
#include "cli/command_args.h"
#include "cli/report_command.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "core/file_io.h"
#include "graph/graph.h"
#include "kernels/cuda/cuda.h"
#include "models/llama.h"
#include "runtime/cpu_threads.h"
#include "spmd/lower.h"
#include "train/pipeline_runner.h"
#include "train/signals.h"
#include "train/trainer.h"

namespace meshtrain::cli {

namespace {

// An estimate below this share of the measured step, or above its inverse,
// is far enough off to blame the profile.
constexpr double kProfileHintBelow = 2.0 / 3.0;

// The [parallel] degrees over 1 that a run on one process does not use ("" if none).
std::string unused_degrees(const parallel::ParallelConfig& p) {
  std::vector<std::string> set;
  for (const auto& [key, n] : {std::pair{"dp_replicate", p.dp_replicate}, std::pair{"dp_shard", p.dp_shard},
                               std::pair{"cp", p.cp}, std::pair{"tp", p.tp}, std::pair{"ep", p.ep}})
    if (n > 1) set.push_back(fmt::format("parallel.{} {}", key, n));
  return fmt::format("{}", fmt::join(set, ", "));
}

// What `meshtrain train --help` says after the options.
std::string train_footer() {
  return "Train a Llama from a TOML config; any key can be overridden on the command line. Under mpirun the\n"
         "step is laid out on the mesh of the [parallel] keys (dp_replicate x dp_shard x cp x tp = ranks: DDP, FSDP,\n"
         "HSDP, context parallel, Megatron tensor parallel with sequence_parallel and loss_parallel; ep of the\n"
         "dp_shard ranks, or of dp_shard x cp, split a mixture of experts' experts; pp stages) and every rank runs\n"
         "its part;\n"
         "rank 0 prints and writes metrics and checkpoints (--optimizer.lr 1e-3 or --optimizer.lr=1e-3); each\n"
         "rank's kernels get the host's cores divided by its ranks unless OMP_NUM_THREADS is set.\n"
         "--profile prints the time of each op after training (summed over all steps but the first), with\n"
         "GFLOP/s and GB/s by the ops' FLOP and byte counts.\n"
         "--dump-graph FILE writes the step graph each rank runs as text (its lowered graph under mpirun: every\n"
         "value's local shape and layout, every collective's group, mesh dims, bytes); a {rank} in FILE is\n"
         "replaced by the rank, and without one only rank 0 writes. --no-verify skips the fingerprint the ranks\n"
         "exchange before each collective to fail together on a mismatch (bench/train_dp.sh prints its cost); a\n"
         "group whose ranks share a host and memory (docs/communication.md) checks it anyway, at no cost.\n"
         "--trace FILE writes the last step's measured timeline as a Chrome trace (Perfetto, chrome://tracing):\n"
         "per rank a compute track, every kernel, collective start and wait, and a communication track, each\n"
         "collective from its start to the end of its wait; each rank's times from its own start of the step.\n"
         "The run ends with its step's estimate on the [schedule] hardware profile next to the measured median;\n"
         "--schedule.estimate benchmark first times every kernel of the step on each rank, the ranks side by side as\n"
         "they run the step (they agree on the median; --schedule.kernel_cache FILE keeps the times), and costs the\n"
         "scheduling passes and that estimate with them instead of the profile's roofline.\n"
         "SIGTERM, SIGINT or SIGUSR1 stops the run after the step that is running: the ranks agree on the step,\n"
         "a checkpoint is saved when checkpoint.folder is set, and the exit status is 128 + the signal. Under\n"
         "mpirun send SIGUSR1 to mpirun (it forwards it at once) or SIGTERM to every rank, as schedulers do;\n"
         "SIGTERM or Ctrl-C to mpirun reaches the ranks only after OMPI_MCA_odls_base_sigkill_timeout seconds\n"
         "(1 by default) with SIGKILL as long after, and mpirun prints nothing more of theirs.\n"
         "With metrics.file set, rank 0 also writes run.json (as the run starts and ends) and, at the end,\n"
         "report.html beside it: the run's report page (meshtrain report --help says what it holds).\n"
         "A key given twice (in the file, then on the command line, or twice there) takes the last value.\n";
}

// What `meshtrain lower --help` says after the options.
std::string lower_footer() {
  return "Lay the config's training step out on N ranks by its [parallel] keys, as `mpirun -np N meshtrain train`\n"
         "would, and print rank R's lowered graph (default 0) without running anything: every value with its\n"
         "local shape and layout, every collective with its group, mesh dims, layouts and bytes (each starts\n"
         "where it stands and is completed by a `wait` node, just before the first node that reads its result).\n"
         "With parallel.pp P: rank R's pipeline actions and, for each stage it holds, the programs it runs (the\n"
         "unshard program, once a step; forward; backward, or its input and weight halves for zero-bubble), each\n"
         "laid out on the stage's ranks and lowered for R, as `train --dump-graph` writes them.\n"
         "--out FILE writes the graph to FILE instead and prints one line saying how many nodes it holds.\n";
}

}  // namespace

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

namespace {

double mib(double bytes) { return bytes / (1 << 20); }

std::string coordinate_text(const train::RankReport& r, const sharding::DeviceMesh& mesh) {
  std::vector<std::string> parts;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (mesh.size(m) > 1)
      parts.push_back(fmt::format("{} {}", mesh.names()[static_cast<size_t>(m)], r.coordinate[static_cast<size_t>(m)]));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// What each rank holds: its shards of the parameters, gradients and
// optimizer states, against the whole model's.
void print_held(const std::vector<train::RankReport>& reports, const train::Trainer& trainer) {
  const double whole = static_cast<double>(trainer.parameter_count()) * 4;  // f32 master weights
  fmt::print("each rank holds (MiB; the whole model's f32 parameters: {:.2f}):\n", mib(whole));
  for (const auto& r : reports)
    fmt::print("  rank {} ({}): parameters {:.2f} ({:.0f}%), gradients {:.2f}, optimizer states {:.2f}\n", r.rank,
               coordinate_text(r, trainer.mesh()), mib(r.parameter_bytes), 100 * r.parameter_bytes / whole,
               mib(r.gradient_bytes), mib(r.optimizer_state_bytes));
}

// The default profile describes this project's development VM: where the
// estimate is far from the step this machine ran, say how to measure this one.
void print_profile_hint(const config::TrainConfig& c, double ratio) {
  if (c.schedule.hardware != "auto" || ratio <= 0) return;
  if (ratio >= kProfileHintBelow && ratio <= 1 / kProfileHintBelow) return;
  fmt::print(
      "  the default profile, {}, is this project's 2-core development VM, every core busy with the step; "
      "bench/calibrate.sh measures this machine into a profile for --schedule.hardware FILE\n",
      config::TrainConfig::kDefaultHardware);
}

// What each rank did per step: its collectives and their bytes; its peak
// memory; in a pipeline, its bubble and activations, measured in the last
// step, next to the schedule's simulation with F = I = W.
void print_did(const std::vector<train::RankReport>& reports, const train::Trainer& trainer) {
  fmt::print("each rank did per step:\n");
  const train::PipelineRunner* pipeline = trainer.pipeline();
  std::optional<parallel::PpSimulation> sim;
  if (pipeline) sim = parallel::simulate_pp_schedule(pipeline->schedule());
  for (const auto& r : reports) {
    fmt::print("  rank {} ({}): {} {} moving {:.2f} MiB; peak memory {:.1f} MiB (with the final checkpoint)\n", r.rank,
               coordinate_text(r, trainer.mesh()), static_cast<int64_t>(r.collectives_per_step),
               pipeline ? "sends, receives and all_reduces" : "collectives", mib(r.collective_bytes_per_step),
               mib(r.peak_bytes));
    if (!pipeline) continue;
    const auto rank = static_cast<size_t>(r.rank);
    fmt::print(
        "    last step: bubble {:.1f}% (simulated {:.1f}%), activations held at the peak {:.2f} MiB in {} "
        "(stage, microbatch) pairs (simulated {})\n",
        100 * r.pipeline_bubble, 100 * (1 - sim->busy[rank] / sim->makespan), mib(r.activation_peak_bytes),
        static_cast<int64_t>(r.activation_peak_pairs), sim->peak_activations[rank]);
  }
  if (pipeline) {
    const double published = parallel::published_bubble_fraction(pipeline->schedule());
    fmt::print("  the schedule's bubble: simulated {:.1f}% over all ranks{}\n", 100 * sim->bubble_fraction,
               published >= 0 ? fmt::format(", published formula {:.1f}%", 100 * published) : "");
  }
}

}  // namespace

int run_lower(const CommandArgs& a);

Command add_lower_command(CLI::App& app) {
  auto args = std::make_shared<CommandArgs>();
  CLI::App* lower = app.add_subcommand("lower",
                                       "Print any rank's lowered training step without running it: meshtrain lower "
                                       "--ranks N [--rank R] --config FILE [--section.key value ...]");
  lower->footer(lower_footer());
  add_engine_options(*lower, *args,
                     {{"ranks", "N", "The ranks to lay the step out on", true},
                      {"rank", "R", "The rank whose step to print (default 0)"},
                      {"out", "FILE", "Write the graph to FILE instead of printing it"}},
                     {});
  return {lower, [args] { return run_lower(*args); }};
}

int run_lower(const CommandArgs& a) {
  check_no_unexpected(a, "lower");
  const int64_t ranks = integer_option(a, "lower", "ranks", 1), rank = integer_option(a, "lower", "rank", 0);
  MT_CHECK(ranks >= 1 && ranks <= compile::kMaxLaidOutRanks, "lower: --ranks {} must be between 1 and {}", ranks,
           compile::kMaxLaidOutRanks);
  MT_CHECK(rank >= 0 && rank < ranks, "lower: --rank {} is outside the {} ranks (0..{})", rank, ranks, ranks - 1);
  const config::TrainConfig config = config::load_config(a.options.at("config"), a.overrides);
  if (const auto out = a.options.find("out"); out != a.options.end())
    train::check_output_path(config, out->second, "--out");
  const compile::CompiledRank compiled = compile::compile_rank(config, static_cast<int>(ranks), static_cast<int>(rank),
                                                               compile::scheduling_hardware(config));
  std::string text;
  if (compiled.pipeline) {
    // A pipeline: the rank's stages, each laid out on its stage's ranks and cut into programs, as it runs them.
    std::vector<const compile::PipelineStage*> held;
    for (const auto& [index, stage] : compiled.pipeline->stages) held.push_back(&stage);
    text = compile::pipeline_programs_text(compiled.pipeline->place, held);
  } else if (const compile::FlatStep& flat = *compiled.flat; !flat.layout) {
    text = graph::to_text(flat.global);
  } else {
    const compile::StepLayout& l = *flat.layout;
    text = fmt::format("# rank {} of mesh {}\n{}{}", rank, l.mesh().describe(),
                       spmd::to_text(flat.global, l.lowered, l.sharding),
                       spmd::collective_summary(l.lowered.graph, l.mesh()));
  }
  if (const auto out = a.options.find("out"); out != a.options.end()) {
    write_text(out->second, text);
    fmt::print("lower: rank {} of {}: {} nodes to {}\n", rank, ranks, std::count(text.begin(), text.end(), '\n'),
               out->second);
  } else {
    fmt::print("{}", text);
  }
  return 0;
}

int run_train(const CommandArgs& a);

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<CommandArgs>();
  CLI::App* train = app.add_subcommand("train",
                                       "Train a Llama from a TOML config: meshtrain train --config FILE "
                                       "[--section.key value ...] (meshtrain train --help lists the keys)");
  train->footer(train_footer());
  add_engine_options(
      *train, *args,
      {{"dump-graph", "FILE", "Write the step graph each rank runs as text ({rank} in FILE: every rank)"},
       {"trace", "FILE", "Write the last step's measured timeline as a Chrome trace"}},
      {{"profile", "", "Print each op's time after training (steps 2 and on)"},
       {"no-verify", "", "Skip the fingerprint the ranks exchange before each collective (kept where it is free)"}});
  return {train, [args] { return run_train(*args); }};
}

// training.device cuda: a GPU there, one rank, and no --trace (not there yet).
void check_gpu_run(const CommandArgs& a, int ranks) {
  const kernels::cuda::GpuInfo& gpu = kernels::cuda::require_gpu();
  MT_CHECK(ranks == 1, "training.device cuda runs on one rank for now; this job has {} (mpirun -n 1)", ranks);
  MT_CHECK(!a.options.count("trace"), "--trace of a GPU run is not there yet");
  fmt::print("GPU: {}\n", gpu.describe());
}

int run_train(const CommandArgs& a) {
  train::hand_signals_to_a_thread();  // before MPI, OpenMP or anything else starts a thread
  const bool profile = a.flags.count("profile") > 0;
  const std::string config_path = a.options.at("config");
  const auto& overrides = a.overrides;
  // Under mpirun every rank reads the same config and checks it the same way
  // before any rank talks to another: rank 0 reports a bad one, and every
  // rank exits.
  const comm::LaunchedRank launched = comm::launched_rank();
  config::TrainConfig config;
  try {
    check_no_unexpected(a, "train");
    config = config::load_config(config_path, overrides);
    if (launched.size > 1) compile::check_parallel_config(config, launched.size);
    if (config.schedule.estimate == config::EstimateMode::benchmark)
      compile::check_benchmark_hardware(compile::scheduling_hardware(config));
    if (config.training.device == Device::cuda) check_gpu_run(a, launched.size);
  } catch (const std::exception&) {
    if (launched.rank != 0) {
      // Rank 0 says what is wrong and exits, and mpirun then ends this rank;
      // leaving first could have mpirun end rank 0 before it said it.
      std::this_thread::sleep_for(std::chrono::seconds(10));
      return 2;
    }
    throw;
  }
  comm::ProcessGroupPtr world;
  int threads = 0;
  bool background_progress = true;
  if (launched.size > 1) {
    threads = runtime::set_threads_per_rank(launched.local_size);
    background_progress = runtime::spare_core_for_progress(threads, launched.local_size);
    comm::GroupOptions options;
    options.verify = a.flags.count("no-verify") == 0;
    options.background_progress = background_progress;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.comm.timeout_s * 1000));
    world = comm::create_mpi_world(options);
  }
  train::Trainer trainer(std::move(config), world);
  const auto& c = trainer.config();
  if (const auto dump = a.options.find("dump-graph"); dump != a.options.end()) {
    std::string path = dump->second;
    const auto at = path.find("{rank}");
    if (at != std::string::npos) path.replace(at, 6, std::to_string(trainer.rank()));
    if (at != std::string::npos || trainer.rank() == 0) {
      train::check_output_path(trainer.config(), path, "--dump-graph");
      write_text(path, trainer.lowered_text());
    }
  }
  const bool printer = trainer.rank() == 0;
  const bool several = trainer.num_ranks() > 1;
  // Collectives: every rank gathers the reports, rank 0 prints them.
  const std::vector<train::RankReport> held = several ? trainer.rank_reports() : std::vector<train::RankReport>{};
  const auto trace_path = a.options.find("trace");
  trainer.set_tracing(trace_path != a.options.end());
  if (trace_path != a.options.end() && trainer.rank() == 0) {
    train::check_output_path(trainer.config(), trace_path->second, "--trace");
    check_output_file(trace_path->second, "--trace");  // fails now, not after training
  }
  TrainReport run_report(trainer);  // rank 0, with metrics.file: run.json and report.html beside it
  // Preemption or Ctrl-C (SIGTERM, SIGINT, SIGUSR1): a checkpoint after the
  // step that is running, then exit 128 + the signal (--help says how under mpirun).
  train::stop_at_step_end_on_signals(several);
  if (!printer) {
    const auto summary = trainer.run(nullptr);
    trainer.rank_reports();
    if (summary.stopped_by_signal != 0) {
      trainer.wait_for_all_ranks();  // rank 0 has said so: a rank that exits non-zero ends the job under mpirun
      return 128 + summary.stopped_by_signal;
    }
    if (trace_path != a.options.end()) trainer.trace();  // gathered to rank 0
    return 0;
  }
  fmt::print("meshtrain train: {}: {:.2f}M parameters\n", models::describe(c.model),
             static_cast<double>(trainer.parameter_count()) / 1e6);
  fmt::print(
      "data {} (batch {} x seq {}), {} steps, AdamW lr {} wd {}, clip {}, {} rank{}, {} compute, {:.1f} GFLOP/step{}\n",
      c.data.path, c.data.batch_size, c.data.seq_len, c.training.steps, c.optimizer.lr, c.optimizer.weight_decay,
      c.training.max_grad_norm, trainer.num_ranks(), several ? "s" : "", dtype_name(c.training.dtype),
      trainer.flops_per_step() / 1e9, several ? " on rank 0" : "");
  if (several) {
    fmt::print(
        "layout: {}; {} kernel thread{} per rank{}\n", trainer.layout_summary(), threads, threads > 1 ? "s" : "",
        background_progress ? "" : " (no core to spare: collectives advance where they start and are waited on)");
    print_held(held, trainer);
  } else if (const std::string unused = unused_degrees(c.parallel); !unused.empty()) {
    fmt::print("layout: one rank: {} take effect under mpirun with the ranks they multiply to; not here\n", unused);
  }
  std::fflush(stdout);
  run_report.started(several ? held : trainer.rank_reports());
  trainer.set_profiling(profile);
  train::Trainer::Summary summary;
  try {
    summary = trainer.run(stdout);
  } catch (const std::exception& e) {
    run_report.failed(e.what());
    throw;
  }
  // Every rank takes part (as the others do after their run): the ranks' tables at the end.
  const std::vector<train::RankReport> final_ranks = trainer.rank_reports();
  if (summary.stopped_by_signal != 0) {
    try {  // a report that cannot be written does not hide the stop's exit status from the scheduler
      run_report.ended(fmt::format("stopped by {} after step {} of {}", train::signal_name(summary.stopped_by_signal),
                                   summary.last.step, c.training.steps),
                       &summary, final_ranks);
    } catch (const Error& e) {
      std::fprintf(stderr, "meshtrain: warning: the run report was not written: %s\n", e.what());
    }
    // Written as best it can be: after a signal the output may be non-blocking with nobody reading.
    const std::string said = fmt::format(
        "stopped by {} after step {} of {}: loss {:.4f}{}\n", train::signal_name(summary.stopped_by_signal),
        summary.last.step, c.training.steps, summary.last.loss,
        c.checkpoint.folder.empty() ? "; no checkpoint (checkpoint.folder is not set)"
                                    : fmt::format("; checkpoint {}/{} (the run resumes from it)", c.checkpoint.folder,
                                                  checkpoint::checkpoint_folder_name(summary.last.step)));
    std::fputs(said.c_str(), stdout);
    std::fflush(stdout);
    trainer.wait_for_all_ranks();
    return 128 + summary.stopped_by_signal;
  }
  if (summary.steps_run == 0)
    fmt::print("nothing to train: {} is at step {}, training.steps is {} (raise it to train on)\n",
               trainer.resumed_from(), trainer.steps_done(), c.training.steps);
  else
    fmt::print(
        "done: loss {:.4f} -> {:.4f} over {} steps{}{}, {:.0f} tokens/s at the last step{}, peak memory {:.1f} MiB{}\n",
        summary.first.loss, summary.last.loss, summary.steps_run,
        trainer.resumed_from().empty() ? "" : fmt::format(" (resumed after step {})", summary.first.step - 1),
        summary.last.val_loss ? fmt::format(", val_loss {:.4f}", *summary.last.val_loss) : "",
        summary.last.tokens_per_s,
        several ? fmt::format(" ({:.0f} per rank)", summary.last.tokens_per_s / trainer.num_ranks()) : "",
        static_cast<double>(summary.last.peak_bytes_max) / (1 << 20), several ? " on the largest rank" : "");
  const std::string hardware = c.hardware_profile();
  if (summary.steps_run > 0 && trainer.estimated_step_ms() > 0) {
    const double ratio = summary.median_step_ms > 0 ? trainer.estimated_step_ms() / summary.median_step_ms : 0.0;
    fmt::print(
        "estimate of this step on {} ({}): {:.1f} ms; measured: {:.1f} ms (the median of steps {}..{}), ratio {:.3f}\n",
        hardware, c.schedule.estimate == config::EstimateMode::benchmark ? "kernels timed here" : "roofline",
        trainer.estimated_step_ms(), summary.median_step_ms, std::min(summary.first.step + 1, c.training.steps),
        c.training.steps, ratio);
    print_profile_hint(c, ratio);
  } else if (summary.steps_run > 0)
    fmt::print("no estimate of this step on {}: {}\n", hardware, trainer.no_estimate_because());
  if (several) print_did(final_ranks, trainer);
  if (trace_path != a.options.end()) {
    const std::string trace = trainer.trace();  // every rank takes part
    if (summary.steps_run == 0) {
      fmt::print("no trace: no step ran\n");
    } else {
      write_text(trace_path->second, trace);
      fmt::print("trace of step {}: {} (open in https://ui.perfetto.dev or chrome://tracing)\n", c.training.steps,
                 trace_path->second);
    }
  }
  if (!c.metrics.file.empty()) fmt::print("metrics: {}\n", c.metrics.file);
  const std::string resumed =
      trainer.resumed_from().empty() ? "" : fmt::format(" after resuming from {}", trainer.resumed_from());
  const std::string ended = summary.steps_run == 0
                                ? "finished: nothing to train (at training.steps already)" + resumed
                                : fmt::format("finished: {} steps run{}", summary.steps_run, resumed);
  if (const std::string page = run_report.ended(ended, &summary, final_ranks); !page.empty())
    fmt::print("report: {}\n", page);
  if (profile) print_profile(trainer.profile());
  return 0;
}

int run_export(const std::string& checkpoint, const std::string& out) {
  std::string path = checkpoint;
  if (!std::filesystem::exists(std::filesystem::path(checkpoint) / "metadata.json")) {
    const auto newest = checkpoint::latest_checkpoint(checkpoint);
    MT_CHECK(
        newest.has_value() || std::filesystem::exists(std::filesystem::path(checkpoint) / "rank_00000.safetensors"),
        "export: {} is neither a checkpoint (a folder step_NNNNNN with metadata.json) nor a folder holding a "
        "complete one",
        checkpoint);
    if (newest) path = *newest;
  }
  const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(path);
  std::vector<InputPath> inputs{{path, "the checkpoint being exported"}};
  for (const std::string& step : checkpoint::checkpoint_step_folders(checkpoint))
    inputs.push_back({step, "a checkpoint in " + checkpoint});
  check_not_an_input(out, "--out", inputs);
  check_output_file(out, "--out");
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : checkpoint::load_checkpoint_whole(info))
    if (!name.starts_with("optimizer.")) weights.emplace(name, std::move(t));
  weights = models::hf_tensors(std::move(weights));
  checkpoint::save_safetensors(out, weights);
  size_t count = 0;
  for (const auto& [name, t] : weights) count += static_cast<size_t>(t.shape().numel());
  fmt::print("exported {} (step {}): {} tensors, {:.2f}M parameters, to {}\n", path, info.state.step, weights.size(),
             static_cast<double>(count) / 1e6, out);
  return 0;
}

Command add_export_command(CLI::App& app) {
  auto paths = std::make_shared<std::pair<std::string, std::string>>();  // checkpoint, out
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's whole weights (saved on any number of ranks and layout) as one Hugging Face "
      "safetensors file, Llama parameter names as Hugging Face's; the optimizer's moments are left out. "
      "The checkpoint's files are verified (sizes, checksums) as they are read.");
  export_cmd
      ->add_option("--checkpoint", paths->first,
                   "A checkpoint folder (checkpoint.folder/step_NNNNNN), or a checkpoint.folder: its newest "
                   "complete checkpoint")
      ->required();
  export_cmd->add_option("--out", paths->second, "The .safetensors file to write (written whole or not at all)")
      ->required();

  return {export_cmd, [paths] { return run_export(paths->first, paths->second); }};
}

}  // namespace meshtrain::cli
