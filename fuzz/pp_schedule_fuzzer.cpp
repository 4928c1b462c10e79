// libFuzzer target: a pipeline schedule of one's own (parallel.pp_schedule_csv,
// `meshtrain pp-schedule --from-csv`). Input: a first byte choosing the ranks
// (1 to 8), then the CSV text. A schedule it accepts must lower with its
// sends and receives and FSDP's actions, simulate (every rank busy no longer
// than the makespan), and write back to CSV text that reads as itself.
#include "fuzz/fuzz_input.h"
#include "parallel/pipeline_schedule.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int ranks = data[0] % 8 + 1;
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  fuzz::expect_result_or_clear_error([&] {
    const parallel::PpSchedule s = parallel::pp_schedule_from_csv(text, ranks);
    fuzz::require(s.ranks == ranks && s.stages() == static_cast<int>(s.rank_of_stage.size()));
    const parallel::PpSchedule back = parallel::pp_schedule_from_csv(parallel::pp_schedule_csv(s), ranks);
    fuzz::require(back.actions == s.actions && back.rank_of_stage == s.rank_of_stage &&
                  back.microbatches == s.microbatches);
    parallel::add_pp_fsdp_actions(parallel::add_pp_communication(s));
    const parallel::PpSimulation sim = parallel::simulate_pp_schedule(s);
    for (const double busy : sim.busy) fuzz::require(busy <= sim.makespan + 1e-9);
  });
  return 0;
}
