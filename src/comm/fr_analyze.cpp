#include "comm/fr_analyze.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "comm/flight_recorder.h"
#include "core/error.h"
#include "core/json_integer.h"

namespace meshtrain::comm {

std::string_view fr_finding_kind_name(FrFinding::Kind k) {
  static constexpr std::string_view names[] = {"missing_rank",   "op_mismatch", "dtype_mismatch", "size_mismatch",
                                               "group_mismatch", "no_dump",     "stalled",        "late"};
  return names[static_cast<int>(k)];
}

namespace {

// The largest world a dump may claim: far beyond any job, small enough to list.
constexpr int kMaxFrWorld = 1 << 20;

struct RankDump {
  int rank = 0;
  int world_size = 0;
  int64_t dumped_at_us = 0;  // 0 when the dump does not say
  std::map<std::string, std::vector<int>> groups;
  std::vector<FrEntry> entries;
};

RankDump load_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  MT_CHECK(in.good(), "cannot open flight recorder dump {}", path.string());
  try {
    nlohmann::json j;
    in >> j;
    RankDump d;
    // Checked before anything is sized or looped by them.
    d.world_size = static_cast<int>(json_integer(j, "world_size", 1, kMaxFrWorld));
    d.rank = static_cast<int>(json_integer(j, "rank", 0, d.world_size - 1));
    if (j.contains("dumped_at_us")) d.dumped_at_us = json_integer(j, "dumped_at_us", 0, INT64_MAX);
    MT_CHECK(j.contains("groups") && j["groups"].is_object(), "key 'groups' must be an object of groups");
    for (const auto& [name, g] : j["groups"].items())
      for (int64_t member : json_integer_list(g, "ranks", 0, d.world_size - 1))
        d.groups[name].push_back(static_cast<int>(member));
    MT_CHECK(j.contains("entries") && j["entries"].is_array(), "key 'entries' must be an array of entries");
    d.entries = j["entries"].get<std::vector<FrEntry>>();
    return d;
  } catch (const InternalError&) {  // a bug of ours, not the file's: never reported as a bad dump
    throw;
  } catch (const std::exception& e) {  // the JSON library's and ours: either way the file is named
    throw InvalidArgument(fmt::format("flight recorder dump {} is not valid: {}", path.string(), json_error_text(e)));
  }
}

// "0, 2, 5..9": runs of consecutive ranks as ranges, so a world of a million prints in a line.
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j >= i + 2 ? fmt::format("{}..{}", ranks[i], ranks[j])
                               : fmt::format("{}", fmt::join(ranks.begin() + static_cast<long>(i),
                                                             ranks.begin() + static_cast<long>(j) + 1, ", ")));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// The ranks outside the largest class of equal values: the odd ones out.
template <typename Key>
std::vector<int> minority(const std::map<int, Key>& value_by_rank) {
  std::map<Key, std::vector<int>> classes;
  for (const auto& [rank, v] : value_by_rank) classes[v].push_back(rank);
  auto largest = std::max_element(classes.begin(), classes.end(),
                                  [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  std::vector<int> out;
  for (const auto& [v, ranks] : classes)
    if (&ranks != &largest->second) out.insert(out.end(), ranks.begin(), ranks.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::string describe_entry(const FrEntry& e) {
  return fmt::format("{} [{}] ({})", op_type_name(e.op), e.signature, fr_state_name(e.state));
}

// Walk one group's collectives in seq order and report the first place where
// its members are out of step. Later seqs are not trusted after that.
// Sub-groups made by one split share a name ("d0" on every mesh row), so a
// group is its name and its members, as in PyTorch's analyzer.
bool same_group(const RankDump& d, const std::string& group, const std::string& name, const std::vector<int>& members) {
  if (group != name) return false;
  auto it = d.groups.find(group);
  return it != d.groups.end() && it->second == members;
}

// Dumps are taken at different moments. A rank that gave up on a
// collective (it timed out and dumped, or failed) while another finished
// that collective only afterwards: the other rank joined too late (stopped,
// slow, or held up before it), and what its dump shows after that moment
// happened once the first had given up. Wall-clock times: across hosts they
// are as good as the hosts' clocks agree, far finer than a timeout.
std::optional<FrFinding> late_ranks(const std::string& name, uint64_t seq, const std::map<int, const FrEntry*>& present,
                                    const std::map<int, RankDump>& dumps) {
  std::map<int, int64_t> gave_up_at;  // rank -> when it stopped waiting
  for (const auto& [r, e] : present) {
    if (e->state == FrState::failed)
      gave_up_at[r] = e->time_completed_us;
    else if (e->state != FrState::completed && dumps.at(r).dumped_at_us > 0)
      gave_up_at[r] = dumps.at(r).dumped_at_us;
  }
  if (gave_up_at.empty()) return std::nullopt;
  const auto first_gave_up = std::min_element(gave_up_at.begin(), gave_up_at.end(),
                                              [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<int> late;
  std::vector<std::string> how;
  for (const auto& [r, e] : present)
    if (e->state == FrState::completed && e->time_completed_us > first_gave_up->second) {
      late.push_back(r);
      how.push_back(fmt::format("rank {} issued it {} ms after rank {} and finished it {} ms after rank {} gave up", r,
                                (e->time_created_us - present.at(first_gave_up->first)->time_created_us) / 1000,
                                first_gave_up->first, (e->time_completed_us - first_gave_up->second) / 1000,
                                first_gave_up->first));
    }
  if (late.empty()) return std::nullopt;
  const FrEntry& waited = *present.at(first_gave_up->first);
  FrFinding f;
  f.kind = FrFinding::Kind::late;
  f.group = name;
  f.seq = seq;
  f.culprits = late;
  f.time_us = waited.time_created_us;
  f.message = fmt::format(
      "group '{}' seq {} {}: rank {} waited {} ms in it and gave up; {}: rank(s) {} joined too late (stopped, slow, "
      "or held up before it), and what their dumps show after it happened once rank {} had given up",
      name, seq, op_type_name(waited.op), first_gave_up->first, (first_gave_up->second - waited.time_created_us) / 1000,
      fmt::join(how, "; "), rank_list(late), first_gave_up->first);
  return f;
}

std::optional<FrFinding> check_group(const std::string& name, const std::vector<int>& members,
                                     const std::map<int, RankDump>& dumps) {
  std::map<int, std::map<uint64_t, const FrEntry*>> by_rank;  // world rank -> seq -> entry
  for (int r : members) {
    auto it = dumps.find(r);
    if (it == dumps.end()) continue;
    auto& seqs = by_rank[r];
    for (const auto& e : it->second.entries)
      if (!e.p2p && same_group(it->second, e.group, name, members)) seqs[e.seq] = &e;
  }
  if (by_rank.empty()) return std::nullopt;
  uint64_t first = 0;
  for (const auto& [r, seqs] : by_rank)
    if (!seqs.empty()) first = std::max(first, seqs.begin()->first);  // older entries may have left the ring
  // The seqs some rank recorded, from the first every rank still holds: a
  // seq no rank holds tells nothing, and a dump's seq numbers (whatever
  // their range) cost only as many steps as it has entries.
  std::set<uint64_t> recorded;
  for (const auto& [r, seqs] : by_rank)
    for (auto it = seqs.lower_bound(std::max<uint64_t>(first, 1)); it != seqs.end(); ++it) recorded.insert(it->first);
  std::vector<int> no_dump;
  for (int r : members)
    if (!dumps.count(r)) no_dump.push_back(r);
  for (const uint64_t seq : recorded) {
    std::vector<int> absent;
    std::map<int, const FrEntry*> present;
    for (const auto& [r, seqs] : by_rank) {
      auto it = seqs.find(seq);
      if (it != seqs.end())
        present[r] = it->second;
      else
        absent.push_back(r);
    }
    const FrEntry& sample = *present.begin()->second;
    int64_t issued = INT64_MAX;
    for (const auto& [r, e] : present) issued = std::min(issued, e->time_created_us);
    FrFinding f;
    f.group = name;
    f.seq = seq;
    f.time_us = issued;
    if (!absent.empty()) {
      std::vector<std::string> lasts;
      for (int r : absent) {
        const auto& seqs = by_rank[r];
        std::string last = seqs.empty() ? fmt::format("rank {} has no collective on it", r)
                                        : fmt::format("rank {} last issued seq {} {}", r, seqs.rbegin()->first,
                                                      describe_entry(*seqs.rbegin()->second));
        if (const int64_t dumped = dumps.at(r).dumped_at_us; dumped > 0 && dumped < issued)
          last += fmt::format(" and dumped its record {} ms before this one was issued", (issued - dumped) / 1000);
        lasts.push_back(std::move(last));
      }
      std::vector<int> joined;
      for (const auto& [r, e] : present) joined.push_back(r);
      f.kind = FrFinding::Kind::missing_rank;
      f.culprits = absent;
      f.message = fmt::format("group '{}' seq {} {}: rank{} {} never joined; rank{} {} issued it ({}); {}", name, seq,
                              op_type_name(sample.op), absent.size() > 1 ? "s" : "", rank_list(absent),
                              joined.size() > 1 ? "s" : "", rank_list(joined), fr_state_name(sample.state),
                              fmt::join(lasts, "; "));
      return f;
    }
    std::map<int, int> ops;
    std::map<int, int> dtypes;
    std::map<int, std::string> sigs;
    for (const auto& [r, e] : present) {
      ops[r] = static_cast<int>(e->op);
      dtypes[r] = static_cast<int>(e->dtype);
      // all_to_all counts differ per rank by design (each rank's row of the
      // exchange); the runtime fingerprint check matches them pair by pair.
      sigs[r] = e->op == OpType::all_to_all ? std::string() : e->signature;
    }
    auto report = [&](FrFinding::Kind kind, std::vector<int> culprits, std::string_view what) {
      std::vector<std::string> per_rank;
      for (const auto& [r, e] : present) per_rank.push_back(fmt::format("rank {}: {}", r, describe_entry(*e)));
      f.kind = kind;
      f.culprits = std::move(culprits);
      f.message = fmt::format("group '{}' seq {}: ranks disagree on the {}; odd one(s) out: rank {} ({})", name, seq,
                              what, rank_list(f.culprits), fmt::join(per_rank, "; "));
      return f;
    };
    if (!minority(ops).empty()) return report(FrFinding::Kind::op_mismatch, minority(ops), "operation");
    if (!minority(dtypes).empty()) return report(FrFinding::Kind::dtype_mismatch, minority(dtypes), "dtype");
    if (!minority(sigs).empty()) return report(FrFinding::Kind::size_mismatch, minority(sigs), "sizes");
    if (auto late = late_ranks(name, seq, present, dumps)) return late;
  }
  if (no_dump.empty()) {
    // Every rank issued a collective and none finished it: the data never
    // went through. A rank stalled inside it (stopped, swapped out) or the
    // link failed; the dumps agree, so they cannot say which.
    for (const uint64_t seq : recorded) {
      std::vector<std::string> states;
      bool all_unfinished = true;
      for (const auto& [r, seqs] : by_rank) {
        const auto it = seqs.find(seq);
        if (it == seqs.end() || it->second->state == FrState::completed || it->second->state == FrState::failed) {
          all_unfinished = false;
          break;
        }
        states.push_back(fmt::format("rank {} {}", r, fr_state_name(it->second->state)));
      }
      if (!all_unfinished || by_rank.size() != members.size()) continue;
      const FrEntry& e = *by_rank.begin()->second.at(seq);
      FrFinding f;
      f.kind = FrFinding::Kind::stalled;
      f.group = name;
      f.seq = seq;
      f.time_us = e.time_created_us;
      f.message = fmt::format(
          "group '{}' seq {} {}: every rank issued it and none finished it ({}): a rank stalled inside it "
          "(stopped, swapped out, starved of CPU) or the link between them failed; the dumps agree, so they "
          "cannot name the rank: look for one that was stopped or slow",
          name, seq, op_type_name(e.op), fmt::join(states, ", "));
      return f;
    }
  }
  if (!no_dump.empty()) {
    // Ranks without a dump: if the others are stuck in a collective of this
    // group (or gave up on one), those ranks are the likely culprits. The
    // oldest one still in flight, else the oldest that failed, not just the
    // newest entry: MPI may finish a later collective of a group before an
    // earlier one. A rank that posts a large collective and then a small
    // one and dies sent the small one's data whole (an eager message) but
    // only announced the large one's (a rendezvous it can no longer serve),
    // and the large one may then fail in MPI.
    for (const auto& [r, seqs] : by_rank) {
      const FrEntry* in_flight = nullptr;
      const FrEntry* failed = nullptr;
      for (const auto& [seq, entry] : seqs) {
        if (entry->state == FrState::scheduled || entry->state == FrState::started) {
          in_flight = entry;
          break;
        }
        if (entry->state == FrState::failed && failed == nullptr) failed = entry;
      }
      const FrEntry* stuck = in_flight != nullptr ? in_flight : failed;
      if (stuck == nullptr) continue;
      const FrEntry& e = *stuck;
      FrFinding f;
      f.kind = FrFinding::Kind::no_dump;
      f.group = name;
      f.seq = e.seq;
      f.time_us = e.time_created_us;
      f.culprits = no_dump;
      f.message = fmt::format(
          "group '{}' seq {} {} is {} on rank {}; rank(s) {} of this group left no dump (dead, "
          "or never reached a point where it could write one) and are the likely culprits",
          name, e.seq, op_type_name(e.op), fr_state_name(e.state), r, rank_list(no_dump));
      return f;
    }
  }
  return std::nullopt;
}

}  // namespace

FrReport analyze_flight_records(const std::string& dir) {
  namespace fs = std::filesystem;
  MT_CHECK(fs::is_directory(dir), "fr-analyze: '{}' is not a directory", dir);
  const std::regex name_re(R"(fr_rank(\d+)\.json)");
  std::map<int, RankDump> dumps;
  std::map<int, std::string> file_of;  // rank -> the file that recorded it
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string fname = entry.path().filename().string();
    if (!std::regex_match(fname, m, name_re)) continue;
    RankDump d = load_dump(entry.path());
    // Dumps of one job: one per rank, all of one world.
    MT_CHECK(!file_of.count(d.rank),
             "fr-analyze: {} records rank {}, which {} also records; the folder must hold "
             "one job's dumps, one per rank",
             fname, d.rank, file_of[d.rank]);
    if (!dumps.empty())
      MT_CHECK(d.world_size == dumps.begin()->second.world_size,
               "fr-analyze: the dumps disagree on the world size ({} in {}, {} in {}); the folder must hold one "
               "job's dumps",
               d.world_size, fname, dumps.begin()->second.world_size, file_of[dumps.begin()->first]);
    file_of[d.rank] = fname;
    dumps[d.rank] = std::move(d);
  }
  MT_CHECK(!dumps.empty(), "fr-analyze: no flight recorder dumps (fr_rank<R>.json) in '{}'", dir);
  FrReport report;
  for (const auto& [r, d] : dumps) {
    report.ranks_loaded.push_back(r);
    report.world_size = std::max(report.world_size, d.world_size);
  }
  for (int r = 0; r < report.world_size; ++r)
    if (!dumps.count(r)) report.ranks_without_dump.push_back(r);

  std::set<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [r, d] : dumps)
    for (const auto& [name, members] : d.groups) {
      if (std::find(members.begin(), members.end(), r) == members.end()) {
        FrFinding f;
        f.kind = FrFinding::Kind::group_mismatch;
        f.group = name;
        f.culprits = {r};
        f.message = fmt::format("rank {} records group '{}' with members [{}], which do not include it", r, name,
                                rank_list(members));
        report.findings.push_back(std::move(f));
      }
      groups.emplace(name, members);
    }
  for (const auto& [name, members] : groups)
    if (auto f = check_group(name, members, dumps)) report.findings.push_back(std::move(*f));
  std::stable_sort(report.findings.begin(), report.findings.end(),
                   [](const FrFinding& a, const FrFinding& b) { return a.time_us < b.time_us; });
  return report;
}

std::string FrReport::to_text() const {
  std::string out = fmt::format("read dumps of rank(s) {} (world size {})\n", rank_list(ranks_loaded), world_size);
  if (!ranks_without_dump.empty()) out += fmt::format("no dump from rank(s) {}\n", rank_list(ranks_without_dump));
  if (findings.empty()) return out + "no mismatch: every recorded collective matches across ranks\n";
  out += fmt::format("FIRST MISMATCH: {}\n", findings.front().message);
  for (size_t i = 1; i < findings.size(); ++i) out += fmt::format("also: {}\n", findings[i].message);
  return out;
}

nlohmann::json FrReport::to_json() const {
  nlohmann::json j;
  j["world_size"] = world_size;
  j["ranks_loaded"] = ranks_loaded;
  j["ranks_without_dump"] = ranks_without_dump;
  j["findings"] = nlohmann::json::array();
  for (const auto& f : findings)
    j["findings"].push_back({{"kind", fr_finding_kind_name(f.kind)},
                             {"group", f.group},
                             {"seq", f.seq},
                             {"culprits", f.culprits},
                             {"message", f.message}});
  return j;
}

}  // namespace meshtrain::comm
