// libFuzzer target: the built-in pipeline schedules (gpipe, 1f1b,
// interleaved_1f1b, zero_bubble, zbv; parallel.pp_schedule). Input bytes
// choose the schedule, the ranks (1 to 16), the stages per rank (1 to 8),
// the microbatches (1 to 64, or 1 to 4 rounds of pp) and the FSDP limit and
// costs the checks use.
// make_pp_schedule is the one place a clear error may come from (a
// combination the schedule cannot run); every schedule it generates must
// lower, simulate and round-trip through CSV with no error at all
// (pp_schedule_checks.h), and, where the published bubble formula holds
// (GPipe; 1F1B, interleaved 1F1B and ZB-H1 with a multiple of pp
// microbatches; ZB-H1 with W at most F and I), simulate to that bubble.
#include <cmath>

#include "fuzz/fuzz_input.h"
#include "fuzz/pp_schedule_checks.h"
#include "parallel/pipeline_schedule.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const auto kind = static_cast<parallel::PpScheduleKind>(data[0] % 5);
  const int ranks = data[1] % 16 + 1, per_rank = data[2] % 8 + 1;
  // With its top bit set, a whole number of rounds (1 to 4 x pp), where the published bubbles hold.
  const int microbatches = (data[3] & 0x80) != 0 ? ranks * (1 + (data[3] & 3)) : data[3] % 64 + 1;
  const unsigned knobs = data[4] | (size > 5 ? static_cast<unsigned>(data[5]) << 8 : 0u);
  parallel::PpSchedule s;
  try {
    s = parallel::make_pp_schedule(kind, ranks, microbatches, per_rank);
  } catch (const meshtrain::Error&) {
    return 0;  // a combination this schedule refuses, with a clear error
  }
  fuzz::require(s.kind == kind && s.ranks == ranks && s.stages_per_rank == per_rank && s.microbatches == microbatches);
  fuzz::check_accepted_schedule(s, knobs);

  // F 1, I and W each 0.5 to 2: ZB-H1's formula assumes W <= F and W <= I (measured: it misses otherwise).
  using K = parallel::PpScheduleKind;
  const parallel::PpCosts costs{1, 0.5 + static_cast<double>(knobs % 4) / 2,
                                0.5 + static_cast<double>((knobs >> 2) % 4) / 2, 0};
  const bool whole_rounds = microbatches % ranks == 0;
  const bool published = kind == K::gpipe || (kind == K::one_f_one_b && whole_rounds) ||
                         (kind == K::interleaved_1f1b && whole_rounds) ||
                         (kind == K::zero_bubble && per_rank == 1 && whole_rounds &&
                          costs.backward_weight <= costs.backward_input && costs.backward_weight <= costs.forward);
  if (published) {
    const double formula = parallel::published_bubble_fraction(s, costs);
    fuzz::require(std::abs(parallel::simulate_pp_schedule(s, costs).bubble_fraction - formula) <= 1e-9);
  }
  return 0;
}
