// The `meshtrain` command.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cli/autoplan_command.h"
#include "cli/bench_comm.h"
#include "cli/estimate_command.h"
#include "cli/fr_analyze_command.h"
#include "cli/layout_commands.h"
#include "cli/pp_schedule_command.h"
#include "cli/report_command.h"
#include "cli/tokenize_command.h"
#include "cli/train_command.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "runtime/cpu_threads.h"
#include "train/signals.h"

int main(int argc, char** argv) {
  // What goes wrong before a command runs is said by the first process only under mpirun; every process exits.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool first = rank == nullptr || std::string_view(rank) == "0";
  // The stack is fitted first: building and parsing the command line can
  // overflow a small one (a sanitizer's frames overflowed 64 KiB).
  try {
    for (const std::string& note : meshtrain::runtime::fit_cpu_resources())
      if (first) std::fprintf(stderr, "meshtrain: %s\n", note.c_str());
  } catch (const std::exception& e) {
    if (first) std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 2;
  }

  CLI::App app{"meshtrain: train transformer language models across many CPU processes and hosts (C++20, MPI)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshtrain 0.1.0");

  using namespace meshtrain::cli;
  // Each command adds itself and its options; the one given runs.
  const std::vector<Command> commands{
      add_bench_comm_command(app), add_fr_analyze_command(app),  add_export_command(app),   add_train_command(app),
      add_lower_command(app),      add_estimate_command(app),    add_autoplan_command(app), add_layout_command(app),
      add_plan_command(app),       add_pp_schedule_command(app), add_tokenize_command(app), add_report_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Every other mistake on the command line: exit code 2, as for any bad input.
    if (!first) return 2;
    std::string command;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg.starts_with("-")) continue;
      for (const CLI::App* sub : app.get_subcommands({}))
        if (sub->get_name() == arg) command = sub->get_name();
      if (command.empty()) {
        std::fprintf(
            stderr,
            "meshtrain: error: unknown command '%s' (the commands: bench comm, fr-analyze, train, "
            "export, lower, estimate, autoplan, layout, plan, pp-schedule, tokenize, report; meshtrain --help says what each does)\n",
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
    for (const Command& command : commands)
      if (*command.parsed) return command.run();
  } catch (const meshtrain::InternalError& e) {
    std::fprintf(stderr,
                 "meshtrain: %s\nThis is a bug in meshtrain, not in the input: please report it with the "
                 "command and config that led to it.\n",
                 e.what());
    if (meshtrain::comm::mpi_initialized()) meshtrain::comm::mpi_abort_job(70);
    return 70;
  } catch (const std::exception& e) {
    // A rank that fails after its launcher signalled it is being taken down
    // with the job (a peer's abort; a stopped rank continued only to be
    // killed): its error is a consequence, said as its own, so that the job's
    // error is said once.
    if (const int signal = meshtrain::train::stop_signal_received(); signal != 0 && rank != nullptr)
      std::fprintf(stderr, "[meshtrain rank %s] error after %s: %s\n", rank,
                   meshtrain::train::signal_name(signal).c_str(), e.what());
    else
      std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    // Under mpirun a failing rank must take the job down with it, or its peers
    // would wait in their next collective until the timeout.
    if (meshtrain::comm::mpi_initialized()) meshtrain::comm::mpi_abort_job(2);
    return 2;
  }
  return 0;
}
