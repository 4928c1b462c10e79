// libFuzzer target: a pipeline schedule of one's own (parallel.pp_schedule_csv,
// `meshtrain pp-schedule --from-csv`). Input: a first byte choosing the ranks
// (1 to 8; with its top bit set, 0: as many as the lines) and the FSDP limit
// and costs the checks use, then the CSV text. The reader is the one place
// a clear error may come from: a schedule it accepts must then lower with
// its sends and receives and FSDP's actions, simulate, and write back to CSV
// text that reads as itself, with no error at all (pp_schedule_checks.h).
#include "fuzz/fuzz_input.h"
#include "fuzz/pp_schedule_checks.h"
#include "parallel/pipeline_schedule.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int ranks = (data[0] & 0x80) != 0 ? 0 : data[0] % 8 + 1;
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  parallel::PpSchedule s;
  try {
    s = parallel::pp_schedule_from_csv(text, ranks);
  } catch (const meshtrain::Error&) {
    return 0;  // refused, with a clear error
  }
  fuzz::require(ranks == 0 || s.ranks == ranks);
  fuzz::check_accepted_schedule(s, data[0] | static_cast<unsigned>(size) << 8);
  return 0;
}
