// `meshtrain pp-schedule`: a pipeline schedule's per-rank actions, lowered
// with its sends and receives, simulated: the timeline, the bubble next to
// the published formula, and the activations each rank holds.
#pragma once

#include <string>

#include "cli/command.h"

namespace meshtrain::cli {

struct PpScheduleCommand {
  std::string schedule = "1f1b";
  int stages = 0;           // pipeline ranks (pp); 0: 4, or the lines of from_csv
  int stages_per_rank = 0;  // 0: 2 for interleaved_1f1b and zbv, else 1
  int microbatches = 8;
  double forward = 1, backward_input = 1, backward_weight = 1, p2p = 0;
  bool comms = false;
  bool fsdp = false;          // with FSDP's UNSHARD, REDUCE_GRAD and RESHARD
  int max_active_stages = 0;  // with fsdp: at most this many of a rank's stages gathered at once (0: all)
  bool json = false;
  bool csv = false;      // print the compute actions as CSV (for parallel.pp_schedule_csv) instead
  std::string from_csv;  // a schedule of one's own (parallel.pp_schedule_csv's format) instead of `schedule`
};
int run_pp_schedule(const PpScheduleCommand& c);

// `meshtrain pp-schedule`, added to `app` with its options.
Command add_pp_schedule_command(CLI::App& app);

}  // namespace meshtrain::cli
