// Reads every rank's flight-recorder dump and names the first collective on
// which the ranks went out of step: a rank that never joined it, or ranks
// that disagree on its op, dtype or sizes.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace meshtrain::comm {

struct FrFinding {
  enum class Kind { missing_rank, op_mismatch, dtype_mismatch, size_mismatch, group_mismatch, no_dump, stalled, late };
  Kind kind = Kind::missing_rank;
  std::string group;
  uint64_t seq = 0;
  std::vector<int> culprits;  // world ranks to look at
  std::string message;
  int64_t time_us = 0;  // when the first rank issued the collective
};
std::string_view fr_finding_kind_name(FrFinding::Kind k);

struct FrReport {
  int world_size = 0;
  std::vector<int> ranks_loaded;
  std::vector<int> ranks_without_dump;
  std::vector<FrFinding> findings;  // the first one (by issue time) first
  bool ok() const { return findings.empty(); }
  std::string to_text() const;
  nlohmann::json to_json() const;
};

// Analyse the dumps fr_rank<R>.json in dir. Throws when none can be read.
FrReport analyze_flight_records(const std::string& dir);

}  // namespace meshtrain::comm
