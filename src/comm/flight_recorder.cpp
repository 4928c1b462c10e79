#include "comm/flight_recorder.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json_integer.h"

namespace meshtrain::comm {

namespace {
constexpr std::string_view kStateNames[] = {"scheduled", "started", "completed", "failed"};
}

std::string_view fr_state_name(FrState s) { return kStateNames[static_cast<int>(s)]; }

namespace {
int64_t steady_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
}  // namespace

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void to_json(nlohmann::json& j, const FrEntry& e) {
  j = nlohmann::json{{"id", e.id},
                     {"group", e.group},
                     {"seq", e.seq},
                     {"p2p", e.p2p},
                     {"op", op_type_name(e.op)},
                     {"dtype", dtype_name(e.dtype)},
                     {"in_numel", e.in_numel},
                     {"out_numel", e.out_numel},
                     {"signature", e.signature},
                     {"peer", e.peer},
                     {"state", fr_state_name(e.state)},
                     {"time_created_us", e.time_created_us},
                     {"time_started_us", e.time_started_us},
                     {"time_completed_us", e.time_completed_us},
                     {"error", e.error}};
}

void from_json(const nlohmann::json& j, FrEntry& e) {
  constexpr int64_t kLargest = int64_t{1} << 62;  // counts, sequence numbers and times of any real run
  e.id = static_cast<uint64_t>(json_integer(j, "id", 0, kLargest));
  e.group = j.at("group").get<std::string>();
  e.seq = static_cast<uint64_t>(json_integer(j, "seq", 0, kLargest));
  e.p2p = j.at("p2p").get<bool>();
  e.op = parse_op_type(j.at("op").get<std::string>());
  e.dtype = parse_dtype(j.at("dtype").get<std::string>());
  e.in_numel = json_integer(j, "in_numel", 0, kLargest);
  e.out_numel = json_integer(j, "out_numel", 0, kLargest);
  e.signature = j.at("signature").get<std::string>();
  e.peer = static_cast<int>(json_integer(j, "peer", -1, std::numeric_limits<int>::max()));
  const auto state = j.at("state").get<std::string>();
  bool known = false;
  for (int i = 0; i < 4; ++i)
    if (kStateNames[i] == state) e.state = static_cast<FrState>(i), known = true;
  MT_CHECK(known, "flight recorder entry {} has unknown state '{}'", e.id, state);
  e.time_created_us = json_integer(j, "time_created_us", -kLargest, kLargest);
  e.time_started_us = json_integer(j, "time_started_us", -kLargest, kLargest);
  e.time_completed_us = json_integer(j, "time_completed_us", -kLargest, kLargest);
  e.error = j.value("error", "");
}

FlightRecorder::FlightRecorder(int world_rank, int world_size, size_t capacity)
    : world_rank_(world_rank), world_size_(world_size), capacity_(capacity) {
  MT_CHECK(capacity > 0, "flight recorder capacity must be positive");
  ring_.reserve(std::min<size_t>(capacity, 4096));
}

void FlightRecorder::add_group(const std::string& name, const std::vector<int>& world_ranks) {
  std::lock_guard lock(mu_);
  groups_[name] = world_ranks;
}

uint64_t FlightRecorder::record(FrEntry entry, std::chrono::steady_clock::time_point created) {
  std::lock_guard lock(mu_);
  entry.id = next_id_++;
  entry.time_created_us = steady_us(created);
  if (ring_.size() < capacity_)
    ring_.push_back(std::move(entry));
  else
    ring_[entry.id % capacity_] = std::move(entry);
  return next_id_ - 1;
}

void FlightRecorder::update(uint64_t id, FrState state, const std::string& error) {
  std::lock_guard lock(mu_);
  if (id + capacity_ < next_id_) return;  // already overwritten
  FrEntry& e = ring_[id % capacity_];
  if (e.id != id) return;
  e.state = state;
  const int64_t t = steady_us(std::chrono::steady_clock::now());
  if (state == FrState::started) e.time_started_us = t;
  if (state == FrState::completed || state == FrState::failed) e.time_completed_us = t;
  if (!error.empty()) e.error = error;
}

std::vector<FrEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mu_);
  std::vector<FrEntry> out;
  out.reserve(ring_.size());
  const size_t start = ring_.size() < capacity_ ? 0 : next_id_ % capacity_;
  const int64_t to_wall = now_us() - steady_us(std::chrono::steady_clock::now());
  for (size_t i = 0; i < ring_.size(); ++i) {
    FrEntry& e = out.emplace_back(ring_[(start + i) % ring_.size()]);
    if (e.desc) e.signature = e.desc->signature();
    for (int64_t* t : {&e.time_created_us, &e.time_started_us, &e.time_completed_us})
      if (*t != 0) *t += to_wall;
  }
  return out;
}

std::string FlightRecorder::default_dump_dir() {
  const char* env = std::getenv("MESHTRAIN_FR_DIR");
  return env && *env ? env : "meshtrain_fr";
}

std::string FlightRecorder::dump(const std::string& dir, const std::string& reason) const {
  nlohmann::json j;
  {
    std::lock_guard lock(mu_);
    j["version"] = 1;
    j["rank"] = world_rank_;
    j["world_size"] = world_size_;
    j["reason"] = reason;
    j["dumped_at_us"] = now_us();
    j["groups"] = nlohmann::json::object();
    for (const auto& [name, ranks] : groups_) j["groups"][name] = {{"ranks", ranks}};
  }
  j["entries"] = entries();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = fmt::format("{}/fr_rank{}.json", dir, world_rank_);
  // A timeout and a peer's dump request can both dump at once: one at a time.
  std::lock_guard dump_lock(dump_mu_);
  if (ec) throw Error(fmt::format("cannot write flight recorder dump {}: {}", path, ec.message()));
  write_file_atomically(path, j.dump(1) + "\n");
  return path;
}

}  // namespace meshtrain::comm
