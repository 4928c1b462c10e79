// libFuzzer target: flight-recorder dumps (comm::analyze_flight_records, as
// `meshtrain fr-analyze DIR` runs it). The input is split at NUL bytes into
// up to four dumps, fr_rank0.json to fr_rank3.json of one folder; the
// report must print as text and as JSON.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "comm/fr_analyze.h"
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch_dir() / "dumps";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string_view rest = fuzz::as_text(data, size);
  for (int rank = 0; rank < 4 && !rest.empty(); ++rank) {
    const size_t nul = rest.find('\0');
    fuzz::write_input("dumps/fr_rank" + std::to_string(rank) + ".json", rest.substr(0, nul));
    if (nul == std::string_view::npos) break;
    rest.remove_prefix(nul + 1);
  }
  fuzz::expect_result_or_clear_error([&] {
    const comm::FrReport report = comm::analyze_flight_records(dir.string());
    fuzz::require(!report.to_text().empty());
    fuzz::require(report.to_json().is_object());
  });
  return 0;
}
