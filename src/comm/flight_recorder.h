// Per-rank ring buffer of the last N collectives and p2p operations, dumped
// as JSON on timeout (and on demand) so that `meshtrain fr-analyze` can find
// the rank that never joined or the ranks that disagree.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/types.h"
#include "core/dtype.h"

namespace meshtrain::comm {

struct OpDesc;

enum class FrState : uint8_t { scheduled, started, completed, failed };
std::string_view fr_state_name(FrState s);

struct FrEntry {
  uint64_t id = 0;
  std::string group;
  uint64_t seq = 0;  // collective seq or p2p seq, per group
  bool p2p = false;
  OpType op = OpType::barrier;
  DType dtype = DType::f32;
  int64_t in_numel = 0;
  int64_t out_numel = 0;
  std::string signature;  // what every rank must agree on (sizes, counts, root, reduce op)
  // Where set, `signature` is formatted from it only when the recorder is
  // read (entries(), dumps): recording costs no formatting.
  std::shared_ptr<const OpDesc> desc;
  int peer = -1;  // p2p peer (group rank)
  FrState state = FrState::scheduled;
  int64_t time_created_us = 0;
  int64_t time_started_us = 0;
  int64_t time_completed_us = 0;
  std::string error;
};

void to_json(nlohmann::json& j, const FrEntry& e);
void from_json(const nlohmann::json& j, FrEntry& e);

class FlightRecorder {
 public:
  FlightRecorder(int world_rank, int world_size, size_t capacity = 2048);

  // Register a group (its world ranks) so the dump can name its members.
  void add_group(const std::string& name, const std::vector<int>& world_ranks);
  // Returns the entry id. `created` is when the operation was issued (the
  // caller's clock reading, so that issuing reads the clock once).
  uint64_t record(FrEntry entry, std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now());
  void update(uint64_t id, FrState state, const std::string& error = {});
  // Oldest first, times in wall-clock microseconds (the ring keeps the
  // steady clock's, which is cheaper to read, and converts them here).
  std::vector<FrEntry> entries() const;

  // Where dumps go: MESHTRAIN_FR_DIR, or ./meshtrain_fr when unset.
  static std::string default_dump_dir();
  // Write <dir>/fr_rank<R>.json (creating dir) and return the path.
  std::string dump(const std::string& dir, const std::string& reason) const;

  int world_rank() const { return world_rank_; }

 private:
  int world_rank_;
  int world_size_;
  size_t capacity_;
  mutable std::mutex mu_;
  mutable std::mutex dump_mu_;
  std::vector<FrEntry> ring_;
  uint64_t next_id_ = 0;
  std::map<std::string, std::vector<int>> groups_;
};

int64_t now_us();  // wall-clock microseconds (comparable across processes on one host)

}  // namespace meshtrain::comm
