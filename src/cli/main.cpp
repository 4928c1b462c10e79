// The `meshtrain` command.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cli/bench_comm.h"
#include "cli/estimate_command.h"
#include "cli/layout_commands.h"
#include "cli/pp_schedule_command.h"
#include "cli/train_command.h"
#include "comm/fr_analyze.h"
#include "comm/mpi_backend.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: train transformer language models across many CPU processes and hosts (C++20, MPI)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshtrain 0.1.0");

  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  meshtrain::cli::CommBenchOptions comm_opts;
  auto* bench_comm =
      bench->add_subcommand("comm",
                            "Time all_reduce, all_gather, reduce_scatter and all_to_all (f32) from --min-bytes to "
                            "--max-bytes (x4 steps): time, algBw and busBw (nccl-tests convention) of meshtrain's "
                            "collectives next to the plain blocking MPI call, measured in the same run. Run under "
                            "mpirun, e.g. `mpirun -np 4 meshtrain bench comm`.");
  bench_comm->add_option("--ops", comm_opts.ops, "Collectives to time")->delimiter(',')->capture_default_str();
  bench_comm->add_option("--min-bytes", comm_opts.min_bytes, "Smallest size (4K, 1M... allowed)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_comm->add_option("--max-bytes", comm_opts.max_bytes, "Largest size")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_comm->add_option("--rounds", comm_opts.rounds, "Alternating meshtrain/MPI rounds per size (median reported)")
      ->capture_default_str();
  bench_comm->add_option("--iters", comm_opts.iters, "Iterations per round (0: by size, 5..50)")->capture_default_str();
  bench_comm->add_flag("!--no-verify", comm_opts.verify,
                       "Skip meshtrain's cross-rank fingerprint check (on by default)");
  bench_comm
      ->add_option("--group-size", comm_opts.group_size,
                   "Run the collectives in groups of this many ranks, every group at once, as a mesh dim of "
                   "that size inside a larger job does (0: all ranks; no MPI baseline otherwise)")
      ->capture_default_str();
  bench_comm
      ->add_option("--bucket", comm_opts.bucket,
                   "Time this many collectives of each size at once, bucketed as training buckets them "
                   "(packed, one collective, unpacked; all_reduce, all_gather, reduce_scatter), next to the "
                   "same collectives as plain MPI calls one by one and as one MPI call on the packed bytes "
                   "(0: one at a time)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench_comm
      ->add_option("--bucket-cap", comm_opts.bucket_cap,
                   "With --bucket: consecutive collectives share a bucket while its bytes (as the size column counts "
                   "them) stay within this size, one alone runs as a plain "
                   "collective, as schedule.bucket_mode = \"size_cap\" does (0: all in one bucket)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_comm->add_flag("--json", comm_opts.json, "Print one JSON document instead of a table");

  std::string fr_dir;
  bool fr_json = false;
  auto* fr =
      app.add_subcommand("fr-analyze",
                         "Read every rank's flight-recorder dump (fr_rank<R>.json, written on a collective timeout) "
                         "and name the first collective where ranks went out of step: the rank that never joined, "
                         "or ranks that disagree on op, dtype or size. Exit code 0: no mismatch; 1: mismatch found; "
                         "2: the dumps could not be read.");
  fr->add_option("dir", fr_dir, "Directory with the dumps")->required();
  fr->add_flag("--json", fr_json, "Print the report as JSON");

  std::string export_checkpoint, export_out;
  auto* export_cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's whole weights (saved on any number of ranks and layout) as one Hugging Face "
      "safetensors file, Llama parameter names as Hugging Face's; the optimizer's moments are left out. "
      "The checkpoint's files are verified (sizes, checksums) as they are read.");
  export_cmd
      ->add_option("--checkpoint", export_checkpoint,
                   "A checkpoint folder (checkpoint.folder/step_NNNNNN), or a checkpoint.folder: its newest "
                   "complete checkpoint")
      ->required();
  export_cmd->add_option("--out", export_out, "The .safetensors file to write (written whole or not at all)")
      ->required();

  auto* train = app.add_subcommand("train",
                                   "Train a Llama from a TOML config: meshtrain train --config FILE "
                                   "[--section.key value ...] (meshtrain train --help lists the keys)");
  train->prefix_command();  // everything after `train` is the trainer's own arguments, --help too
  train->set_help_flag();

  auto* lower = app.add_subcommand("lower",
                                   "Print any rank's lowered training step without running it: meshtrain lower "
                                   "--ranks N [--rank R] --config FILE [--section.key value ...]");
  lower->prefix_command();
  lower->set_help_flag();

  auto* estimate = app.add_subcommand(
      "estimate",
      "Estimate a training step's memory, time, tokens/s and MFU for an N-rank job on a hardware profile "
      "without running it: meshtrain estimate --config FILE --ranks N --hardware NAME|FILE [--json] "
      "[--trace FILE]");
  estimate->prefix_command();
  estimate->set_help_flag();

  meshtrain::cli::LayoutCommand layout_cmd;
  auto* layout = app.add_subcommand(
      "layout", "Print every rank's mesh coordinate, local shape and global offset for a tensor layout");
  layout->add_option("--mesh", layout_cmd.mesh, "Mesh shape, e.g. 4,2")->required();
  layout->add_option("--shape", layout_cmd.shape, "Global tensor shape, e.g. 18,2")->required();
  layout
      ->add_option("--placements", layout_cmd.placements,
                   "One placement per mesh dim in PyTorch notation: R, S(0), S(0)[1], _S(0, 3), P(sum)")
      ->required();
  layout->add_flag("--json", layout_cmd.json, "Print JSON");

  meshtrain::cli::PlanCommand plan_cmd;
  auto* plan = app.add_subcommand(
      "plan",
      "Print the cheapest sequence of collectives that redistributes a tensor from one layout to another, "
      "with each step's bytes and estimated time (PyTorch DTensor's cost model)");
  plan->add_option("--mesh", plan_cmd.mesh, "Mesh shape, e.g. 2,2,2")->required();
  plan->add_option("--shape", plan_cmd.shape, "Global tensor shape, e.g. 8,8,8")->required();
  plan->add_option("--from", plan_cmd.from, "Source layout, e.g. S(0)S(0)S(0)")->required();
  plan->add_option("--to", plan_cmd.to, "Target layout, e.g. RS(0)S(0)")->required();
  plan->add_option("--dtype", plan_cmd.dtype, "Element type")->capture_default_str();
  plan->add_option("--planner", plan_cmd.planner,
                   "dijkstra (optimal under the cost model) or greedy (PyTorch's default)")
      ->capture_default_str();
  plan->add_option("--devices-per-host", plan_cmd.devices_per_host,
                   "Ranks per host: inner mesh dims within a host get intra-host links (87.7 GB/s, 0.6 us), "
                   "outer ones inter-host links (19.3 GB/s, 2.7 us)")
      ->capture_default_str();
  plan->add_option("--link", plan_cmd.links,
                   "Override one mesh dim's link: DIM:LATENCY_US:BANDWIDTH_GBPS (repeatable, once per dim)");
  plan->add_option("--all-to-all-penalty-us", plan_cmd.all_to_all_penalty_us,
                   "Extra cost of an all_to_all over an all_gather of the same bytes (PyTorch used 1.0 until 2026)")
      ->capture_default_str();
  plan->add_flag("!--no-merge", plan_cmd.merge,
                 "Do not merge consecutive same collectives on adjacent mesh dims into one flattened-group collective");
  plan->add_flag("--json", plan_cmd.json, "Print JSON");

  meshtrain::cli::PpScheduleCommand pp_cmd;
  auto* pp =
      app.add_subcommand("pp-schedule",
                         "Print a pipeline schedule's actions per rank, its simulated timeline, its bubble next to the "
                         "published formula and the activations each rank holds; the sends and receives are checked "
                         "to run without deadlock");
  pp->add_option("--schedule", pp_cmd.schedule, "gpipe, 1f1b, interleaved_1f1b, zero_bubble or zbv")
      ->capture_default_str();
  pp->add_option("--from-csv", pp_cmd.from_csv,
                 "A schedule of one's own instead of --schedule: a line per pipeline rank of its compute actions in "
                 "order (0F0,0F1,0B0,...), as parallel.pp_schedule_csv takes it; its stages per rank and "
                 "microbatches are read from it");
  pp->add_option("--stages", pp_cmd.stages,
                 "Pipeline ranks (pp); the model has pp x stages-per-rank stages (default: 4, or --from-csv's lines)");
  pp->add_option("--stages-per-rank", pp_cmd.stages_per_rank,
                 "Stages on each rank (virtual stages): 1 for gpipe and 1f1b, at least 2 for interleaved_1f1b, "
                 "exactly 2 for zbv, any for zero_bubble (default: 2 for interleaved_1f1b and zbv, else 1)");
  pp->add_option("--microbatches", pp_cmd.microbatches, "Microbatches per step")->capture_default_str();
  pp->add_option("--forward", pp_cmd.forward, "Time of one stage's forward of one microbatch")->capture_default_str();
  pp->add_option("--backward-input", pp_cmd.backward_input,
                 "Time of its backward for the stage's input (I; a full backward B is I + W)")
      ->capture_default_str();
  pp->add_option("--backward-weight", pp_cmd.backward_weight, "Time of its backward for the stage's weights (W)")
      ->capture_default_str();
  pp->add_option("--p2p", pp_cmd.p2p, "Time of a send between stages on different ranks")->capture_default_str();
  pp->add_flag("--comms", pp_cmd.comms, "List the actions with their sends and receives");
  pp->add_flag("--fsdp", pp_cmd.fsdp,
               "List the actions with FSDP's too: UNSHARD of each stage first, REDUCE_GRAD after its last weight "
               "gradients, RESHARD last (with --comms: with the sends and receives too)");
  pp->add_option("--max-active-stages", pp_cmd.max_active_stages,
                 "With --fsdp: at most this many of a rank's stages gathered at once, each gathered ahead of its "
                 "next use and dropped when another is needed (parallel.pp_max_active_stages; 0: all, for the step)")
      ->capture_default_str();
  pp->add_flag("--json", pp_cmd.json, "Print JSON");
  pp->add_flag("--csv", pp_cmd.csv,
               "Print only the compute actions, a line per rank, as parallel.pp_schedule_csv and --from-csv take "
               "them (a schedule to edit and run)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Every other mistake on the command line: exit code 2, as for any bad
    // input, said once (under mpirun by the first process only).
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank != nullptr && std::string_view(rank) != "0") return 2;
    std::string command;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.starts_with("-")) continue;
      for (const CLI::App* sub : app.get_subcommands({}))
        if (sub->get_name() == arg) command = sub->get_name();
      if (command.empty()) {
        std::fprintf(stderr,
                     "meshtrain: error: unknown command '%s' (the commands: bench comm, fr-analyze, train, "
                     "export, lower, estimate, layout, plan, pp-schedule; meshtrain --help says what each does)\n",
                     argv[i]);
        return 2;
      }
      if (command == "bench" && i + 1 < argc && std::string_view(argv[i + 1]) == "comm") command = "bench comm";
      break;
    }
    const std::string where = command.empty() ? "" : command + ": ";
    std::fprintf(stderr, "meshtrain: error: %s%s\nRun `meshtrain %s--help` for the options.\n", where.c_str(), e.what(),
                 command.empty() ? "" : (command + " ").c_str());
    return 2;
  }

  try {
    if (*bench_comm) return meshtrain::cli::run_comm_bench(comm_opts);
    if (*layout) return meshtrain::cli::run_layout(layout_cmd);
    if (*train) return meshtrain::cli::run_train(train->remaining());
    if (*lower) return meshtrain::cli::run_lower(lower->remaining());
    if (*export_cmd) return meshtrain::cli::run_export(export_checkpoint, export_out);
    if (*estimate) return meshtrain::cli::run_estimate(estimate->remaining());
    if (*plan) return meshtrain::cli::run_plan(plan_cmd);
    if (*pp) return meshtrain::cli::run_pp_schedule(pp_cmd);
    if (*fr) {
      const auto report = meshtrain::comm::analyze_flight_records(fr_dir);
      if (fr_json)
        fmt::print("{}\n", report.to_json().dump(1));
      else
        fmt::print("{}", report.to_text());
      return report.ok() ? 0 : 1;
    }
  } catch (const meshtrain::InternalError& e) {
    std::fprintf(stderr,
                 "meshtrain: %s\nThis is a bug in meshtrain, not in the input: please report it with the "
                 "command and config that led to it.\n",
                 e.what());
    if (meshtrain::comm::mpi_initialized()) meshtrain::comm::mpi_abort_job(70);
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    // Under mpirun a failing rank must take the job down with it, or its peers
    // would wait in their next collective until the timeout.
    if (meshtrain::comm::mpi_initialized()) meshtrain::comm::mpi_abort_job(2);
    return 2;
  }
  return 0;
}
