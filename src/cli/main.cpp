// The `meshtrain` command.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/bench_comm.h"
#include "comm/fr_analyze.h"
#include "comm/mpi_backend.h"
#include "core/error.h"

namespace {

// Under mpirun a failing rank must take the job down with it, or its peers
// would wait in their next collective until the timeout.
bool running_under_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: train transformer language models across many devices (C++20, MPI/NCCL)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshtrain 0.1.0");

  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  meshtrain::cli::CommBenchOptions comm_opts;
  auto* bench_comm = bench->add_subcommand(
      "comm",
      "Time all_reduce, all_gather, reduce_scatter and all_to_all (f32) from --min-bytes to "
      "--max-bytes (x4 steps): time, algBw and busBw (nccl-tests convention) of meshtrain's "
      "collectives next to the plain blocking MPI call, measured in the same run. Run under "
      "mpirun, e.g. `mpirun -np 4 meshtrain bench comm`.");
  bench_comm->add_option("--ops", comm_opts.ops, "Collectives to time")
      ->delimiter(',')
      ->capture_default_str();
  bench_comm->add_option("--min-bytes", comm_opts.min_bytes, "Smallest size (4K, 1M... allowed)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_comm->add_option("--max-bytes", comm_opts.max_bytes, "Largest size")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  bench_comm->add_option("--rounds", comm_opts.rounds, "Alternating meshtrain/MPI rounds per size (median reported)")
      ->capture_default_str();
  bench_comm->add_option("--iters", comm_opts.iters, "Iterations per round (0: by size, 5..50)")
      ->capture_default_str();
  bench_comm->add_flag("!--no-verify", comm_opts.verify,
                       "Skip meshtrain's cross-rank fingerprint check (on by default)");
  bench_comm->add_flag("--json", comm_opts.json, "Print one JSON document instead of a table");

  std::string fr_dir;
  bool fr_json = false;
  auto* fr = app.add_subcommand(
      "fr-analyze",
      "Read every rank's flight-recorder dump (fr_rank<R>.json, written on a collective timeout) "
      "and name the first collective where ranks went out of step: the rank that never joined, "
      "or ranks that disagree on op, dtype or size. Exit code 0: no mismatch; 1: mismatch found; "
      "2: the dumps could not be read.");
  fr->add_option("dir", fr_dir, "Directory with the dumps")->required();
  fr->add_flag("--json", fr_json, "Print the report as JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*bench_comm) return meshtrain::cli::run_comm_bench(comm_opts);
    if (*fr) {
      const auto report = meshtrain::comm::analyze_flight_records(fr_dir);
      if (fr_json)
        fmt::print("{}\n", report.to_json().dump(1));
      else
        fmt::print("{}", report.to_text());
      return report.ok() ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    if (running_under_mpi()) meshtrain::comm::mpi_abort_job(2);
    return 2;
  }
  return 0;
}
