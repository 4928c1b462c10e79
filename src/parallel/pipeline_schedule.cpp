#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <tuple>

#include "core/error.h"

namespace meshtrain::parallel {

namespace {

constexpr std::string_view kScheduleNames[] = {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "csv"};
constexpr size_t kGeneratedSchedules = 5;  // the names before "csv"
constexpr std::string_view kActionNames[] = {"F",      "I",      "W",       "B",       "SEND_F",     "RECV_F",
                                             "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"};

// Limits that keep a typed number from asking for billions of actions.
constexpr int kMaxRanks = 1024;
constexpr int kMaxStagesPerRank = 64;
constexpr int kMaxMicrobatches = 1 << 16;
constexpr int64_t kMaxActions = int64_t{1} << 20;

// Which (stage, type, microbatch) of the compute, send and receive types
// have happened: one flag each, for schedules of up to kMaxActions.
class ActionFlags {
 public:
  ActionFlags(int stages, int microbatches)
      : microbatches_(static_cast<size_t>(microbatches)),
        flags_(static_cast<size_t>(stages) * kTypes * static_cast<size_t>(microbatches), 0) {}
  void set(const PpAction& a) { flags_[index(a.stage, a.type, a.microbatch)] = 1; }
  bool has(int stage, PpActionType type, int microbatch) const { return flags_[index(stage, type, microbatch)] != 0; }

 private:
  static constexpr size_t kTypes = static_cast<size_t>(PpActionType::recv_b) + 1;
  size_t index(int stage, PpActionType type, int microbatch) const {
    MT_ASSERT(static_cast<size_t>(type) < kTypes, "action flags hold compute, send and receive actions only");
    return (static_cast<size_t>(stage) * kTypes + static_cast<size_t>(type)) * microbatches_ +
           static_cast<size_t>(microbatch);
  }
  size_t microbatches_;
  std::vector<uint8_t> flags_;
};

// Builds one rank's list: the next forward or backward of each local stage.
struct RankBuilder {
  int rank;
  std::vector<PpAction>& out;
  std::map<int, int> next_forward, next_input_backward;  // stage -> microbatch
  std::deque<std::pair<int, int>> pending_weight;        // (stage, microbatch), oldest first
  void forward(int stage) { out.push_back({stage, PpActionType::forward, next_forward[stage]++}); }
  void backward(int stage) { out.push_back({stage, PpActionType::backward, next_input_backward[stage]++}); }
  void input_backward(int stage) {
    const int mb = next_input_backward[stage]++;
    out.push_back({stage, PpActionType::backward_input, mb});
    pending_weight.emplace_back(stage, mb);
  }
  void oldest_weight_backward() {
    if (pending_weight.empty()) return;
    out.push_back({pending_weight.front().first, PpActionType::backward_weight, pending_weight.front().second});
    pending_weight.pop_front();
  }
};

// GPipe: every forward, then every backward.
void gpipe(RankBuilder& b, int m) {
  for (int i = 0; i < m; ++i) b.forward(b.rank);
  for (int i = 0; i < m; ++i) b.backward(b.rank);
}

// 1F1B: as many forwards as stages from here to the last, then a backward
// and a forward in turn, then the backwards left.
void one_f_one_b(RankBuilder& b, int p, int m) {
  const int warmup = std::min(m, p - b.rank);
  for (int i = 0; i < warmup; ++i) b.forward(b.rank);
  for (int done = 0; done < m; ++done) {
    b.backward(b.rank);
    if (warmup + done < m) b.forward(b.rank);
  }
}

// Interleaved 1F1B and zero-bubble with v stages per rank (Megatron's
// depth-first order): forwards go through the rank's stages in runs of
// `per_round` microbatches, first stage first; backwards the same runs, last
// stage first. After a warm-up, each forward is followed by a backward.
// Zero-bubble runs the input half of each backward there and the weight
// half of the oldest pending one after it, once the rank is `rank` input
// backwards in (its wait for the next stage's gradient filled with work).
void depth_first(RankBuilder& b, int p, int v, int m, bool split_backward) {
  const int rounds = std::max(1, m / p);
  const int per_round = m / rounds;
  const int total = v * m;
  const int warmup = std::min((v - 1) * per_round + (split_backward ? 1 : 2) * (p - 1 - b.rank), total);
  auto forward_stage = [&](int k) { return ((k / per_round) % v) * p + b.rank; };
  auto backward_stage = [&](int k) { return (v - 1 - (k / per_round) % v) * p + b.rank; };
  int forwards = 0;
  for (; forwards < warmup; ++forwards) b.forward(forward_stage(forwards));
  for (int k = 0; k < total; ++k) {
    if (forwards < total) b.forward(forward_stage(forwards++));
    if (!split_backward) {
      b.backward(backward_stage(k));
      continue;
    }
    b.input_backward(backward_stage(k));
    if (k >= b.rank) b.oldest_weight_backward();
  }
  while (!b.pending_weight.empty()) b.oldest_weight_backward();
}

// ZB-V: two stages per rank in a V (chunk 0 = stage r going down the ranks,
// chunk 1 = stage 2p-1-r coming back). Generated for n = max(2p-1, m)
// microbatches, and those past m dropped, so that any m works.
void zbv(RankBuilder& b, int p, int m) {
  const int r = b.rank, n = std::max(2 * p - 1, m);
  const int chunk0 = r, chunk1 = 2 * p - 1 - r;
  auto f = [&](int stage) {
    if (b.next_forward[stage] < n) b.forward(stage);
  };
  auto i = [&](int stage) {
    if (b.next_input_backward[stage] < n) b.input_backward(stage);
  };
  auto w = [&](int stage) {  // the oldest pending weight backward of this stage
    const auto it =
        std::find_if(b.pending_weight.begin(), b.pending_weight.end(), [&](const auto& e) { return e.first == stage; });
    if (it == b.pending_weight.end()) return;
    b.out.push_back({stage, PpActionType::backward_weight, it->second});
    b.pending_weight.erase(it);
  };
  for (int k = 0; k < 2 * (p - r) - 1; ++k) f(chunk0);
  for (int k = 0; k < r; ++k) f(chunk1), f(chunk0);
  for (int k = 0; k < p - r; ++k) f(chunk1), i(chunk1), w(chunk1);
  while (b.next_forward[chunk1] < b.next_forward[chunk0] || b.next_forward[chunk0] < n) {
    f(chunk0), i(chunk0), w(chunk0), f(chunk1), i(chunk1), w(chunk1);
  }
  for (int k = 0; k < r; ++k) i(chunk0), i(chunk1);
  for (int k = 0; k < p - r; ++k) i(chunk0), w(chunk0);
  for (const int stage : {chunk1, chunk0}) {  // the weight backwards left, chunk 1's first
    const auto pending = std::count_if(b.pending_weight.begin(), b.pending_weight.end(),
                                       [&](const auto& e) { return e.first == stage; });
    for (int k = 0; k < pending; ++k) w(stage);
  }
  std::erase_if(b.out, [&](const PpAction& a) { return a.microbatch >= m; });
}

double duration(const PpAction& a, const PpCosts& c) {
  switch (a.type) {
    case PpActionType::forward:
      return c.forward;
    case PpActionType::backward_input:
      return c.backward_input;
    case PpActionType::backward_weight:
      return c.backward_weight;
    case PpActionType::backward:
      return c.backward();
    default:
      return 0;
  }
}

std::string describe_stuck(const std::vector<std::vector<PpAction>>& lists, const std::vector<size_t>& next) {
  std::vector<std::string> parts;
  for (size_t r = 0; r < lists.size(); ++r)
    if (next[r] < lists[r].size()) parts.push_back(fmt::format("rank {} at {}", r, to_string(lists[r][next[r]])));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::string_view pp_schedule_name(PpScheduleKind kind) { return kScheduleNames[static_cast<int>(kind)]; }

std::string pp_schedule_names() {
  return fmt::format("{}", fmt::join(std::span(kScheduleNames).first(kGeneratedSchedules), ", "));
}

PpScheduleKind parse_pp_schedule(std::string_view name) {
  for (size_t k = 0; k < kGeneratedSchedules; ++k)
    if (kScheduleNames[k] == name) return static_cast<PpScheduleKind>(k);
  throw InvalidArgument(
      fmt::format("pp_schedule '{}' is not a pipeline schedule; choose one of {}", name, pp_schedule_names()));
}

bool is_compute(PpActionType type) {
  return type == PpActionType::forward || type == PpActionType::backward_input ||
         type == PpActionType::backward_weight || type == PpActionType::backward;
}

namespace {
// UNSHARD, RESHARD and REDUCE_GRAD are of a stage, for all its microbatches.
bool takes_microbatch(PpActionType type) {
  return type != PpActionType::unshard && type != PpActionType::reshard && type != PpActionType::reduce_grad;
}
}  // namespace

std::string to_string(const PpAction& a) {
  return takes_microbatch(a.type) ? fmt::format("{}{}{}", a.stage, kActionNames[static_cast<int>(a.type)], a.microbatch)
                                  : fmt::format("{}{}", a.stage, kActionNames[static_cast<int>(a.type)]);
}

PpAction parse_pp_action(std::string_view text) {
  auto fail = [&](std::string_view why) {
    return InvalidArgument(
        fmt::format("pipeline action '{}': {} (an action is a stage, a type and a microbatch, as "
                    "2F0, 1I3, 0SEND_F1, 1UNSHARD)",
                    text, why));
  };
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 9) throw fail("it does not start with a stage number");
  PpAction a;
  a.stage = std::stoi(std::string(text.substr(0, i)));
  size_t j = i;
  while (j < text.size() && !std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  const std::string_view type = text.substr(i, j - i);
  const auto* found = std::find(std::begin(kActionNames), std::end(kActionNames), type);
  if (found == std::end(kActionNames)) throw fail(fmt::format("'{}' is no action type", type));
  a.type = static_cast<PpActionType>(found - std::begin(kActionNames));
  const std::string_view number = text.substr(j);
  if (!takes_microbatch(a.type)) {
    if (!number.empty()) throw fail(fmt::format("{} takes no microbatch", type));
    return a;
  }
  if (number.empty() || number.size() > 9 ||
      !std::all_of(number.begin(), number.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    throw fail("it does not end with a microbatch number");
  a.microbatch = std::stoi(std::string(number));
  return a;
}

namespace {
std::string_view trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  return text;
}

// The CSV's lines of actions (not blank, not a # comment), each with its line number.
std::vector<std::pair<int, std::string_view>> csv_action_lines(std::string_view text) {
  std::vector<std::pair<int, std::string_view>> lines;
  for (int number = 1; !text.empty(); ++number) {
    const size_t end = text.find('\n');
    const std::string_view line = trimmed(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.empty() && line.front() != '#') lines.emplace_back(number, line);
  }
  return lines;
}
}  // namespace

PpSchedule pp_schedule_from_csv(std::string_view text, int ranks) {
  const std::vector<std::pair<int, std::string_view>> lines = csv_action_lines(text);
  if (ranks == 0) ranks = std::max(1, static_cast<int>(std::min<size_t>(lines.size(), kMaxRanks + 1)));
  MT_CHECK(ranks >= 1 && ranks <= kMaxRanks, "pp = {}: the pipeline needs 1 to {} ranks", ranks, kMaxRanks);
  PpSchedule s;
  s.kind = PpScheduleKind::csv;
  s.ranks = ranks;
  int stages = 0, microbatches = 0;
  int64_t total = 0;
  std::map<int, std::pair<int, int>> stage_rank;  // stage -> (rank, line it was first seen on)
  for (const auto& [line_number, line] : lines) {
    const int rank = static_cast<int>(s.actions.size());
    MT_CHECK(rank < ranks, "pipeline schedule CSV line {}: more than the pp = {} lines of actions (one per rank)",
             line_number, ranks);
    std::vector<PpAction>& actions = s.actions.emplace_back();
    int cell = 0;
    for (std::string_view rest = line;;) {
      const size_t comma = rest.find(',');
      const std::string_view item = trimmed(rest.substr(0, comma));
      ++cell;
      if (!item.empty()) {
        PpAction a;
        try {
          a = parse_pp_action(item);
        } catch (const InvalidArgument& e) {
          throw InvalidArgument(fmt::format("pipeline schedule CSV line {}, cell {}: {}", line_number, cell, e.what()));
        }
        MT_CHECK(is_compute(a.type),
                 "pipeline schedule CSV line {}, cell {}: {} is not a compute action (F, I, W or "
                 "B): the sends, receives and FSDP actions are added from the compute order",
                 line_number, cell, item);
        MT_CHECK(a.stage < kMaxRanks * kMaxStagesPerRank && a.microbatch < kMaxMicrobatches,
                 "pipeline schedule CSV line {}, cell {}: {} is past {} stages or {} microbatches", line_number, cell,
                 item, kMaxRanks * kMaxStagesPerRank, kMaxMicrobatches);
        MT_CHECK(++total <= kMaxActions, "pipeline schedule CSV: more than {} actions", kMaxActions);
        const auto [it, added] = stage_rank.try_emplace(a.stage, rank, line_number);
        MT_CHECK(it->second.first == rank,
                 "pipeline schedule CSV line {}, cell {}: stage {} is on rank {} (line {}) "
                 "already; a stage lives on one rank",
                 line_number, cell, a.stage, it->second.first, it->second.second);
        stages = std::max(stages, a.stage + 1);
        microbatches = std::max(microbatches, a.microbatch + 1);
        actions.push_back(a);
      }
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  MT_CHECK(static_cast<int>(s.actions.size()) == ranks,
           "pipeline schedule CSV: {} lines of actions for pp = {} ranks (one line per rank)", s.actions.size(), ranks);
  MT_CHECK(stages > 0, "pipeline schedule CSV: no actions on any of the {} lines: every rank needs a stage", ranks);
  MT_CHECK(static_cast<int>(stage_rank.size()) == stages,
           "pipeline schedule CSV: stages 0 to {} appear, but not all of them: every stage must have actions",
           stages - 1);
  MT_CHECK(stages % ranks == 0, "pipeline schedule CSV: {} stages over {} ranks: every rank must hold as many", stages,
           ranks);
  // Each (stage, microbatch) needs two actions or more: told here, before
  // validating takes a cell per pair (4 GiB for 64 KiB of text otherwise).
  MT_CHECK(int64_t{stages} * microbatches <= kMaxActions / 2,
           "pipeline schedule CSV: {} stages x {} microbatches needs more than the {} actions a schedule may have "
           "(each pair an F and a B, or an F, an I and a W)",
           stages, microbatches, kMaxActions);
  s.stages_per_rank = stages / ranks;
  s.microbatches = microbatches;
  s.rank_of_stage.resize(static_cast<size_t>(stages));
  std::vector<int> held(static_cast<size_t>(ranks));
  for (const auto& [stage, where] : stage_rank) {
    s.rank_of_stage[static_cast<size_t>(stage)] = where.first;
    ++held[static_cast<size_t>(where.first)];
  }
  for (int r = 0; r < ranks; ++r)
    MT_CHECK(held[static_cast<size_t>(r)] == s.stages_per_rank,
             "pipeline schedule CSV: rank {} holds {} stages, but {} stages over {} ranks is {} each", r,
             held[static_cast<size_t>(r)], stages, ranks, s.stages_per_rank);
  validate_pp_schedule(s);
  // Ranks that wait on each other are refused here, with the file, not left
  // for the lowering to find (or to pass unseen where none is asked for).
  add_pp_communication(s);
  return s;
}

std::string pp_schedule_csv(const PpSchedule& s) {
  std::string out;
  for (const auto& actions : s.actions) {
    std::vector<std::string> cells;
    for (const PpAction& a : actions)
      if (is_compute(a.type)) cells.push_back(to_string(a));
    out += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return out;
}

PpSchedule add_pp_fsdp_actions(const PpSchedule& s, int max_active_stages) {
  MT_CHECK(max_active_stages >= 0, "pp_max_active_stages = {}: give 0 (every stage of a rank) or more",
           max_active_stages);
  PpSchedule out = s;
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<int> local;
    for (int stage = 0; stage < s.stages(); ++stage)
      if (s.rank_of_stage[static_cast<size_t>(stage)] == r) local.push_back(stage);
    const std::vector<PpAction>& in = s.actions[static_cast<size_t>(r)];
    std::vector<PpAction>& list = out.actions[static_cast<size_t>(r)];
    list.clear();
    const bool all_at_once = max_active_stages == 0 || max_active_stages >= static_cast<int>(local.size());
    if (all_at_once)
      for (const int stage : local) list.push_back({stage, PpActionType::unshard, 0});
    std::vector<int> active;          // gathered now, in the order they were
    std::map<int, int> weights_done;  // stage -> microbatches whose weight gradients are in
    int reduce = -1;                  // a stage whose REDUCE_GRAD goes after the sends that follow its last backward
    for (size_t i = 0; i < in.size(); ++i) {
      const PpAction& a = in[i];
      const bool send = a.type == PpActionType::send_f || a.type == PpActionType::send_b;
      if (reduce >= 0 && !(send && a.stage == reduce)) {
        list.push_back({reduce, PpActionType::reduce_grad, 0});
        reduce = -1;
      }
      if (!all_at_once && is_compute(a.type)) {
        // The next max_active_stages distinct stages to compute, from this action on, stay or become gathered.
        std::vector<int> next;
        for (size_t j = i; j < in.size() && static_cast<int>(next.size()) < max_active_stages; ++j)
          if (is_compute(in[j].type) && std::find(next.begin(), next.end(), in[j].stage) == next.end())
            next.push_back(in[j].stage);
        for (auto it = active.begin(); it != active.end();)
          if (std::find(next.begin(), next.end(), *it) == next.end()) {
            list.push_back({*it, PpActionType::reshard, 0});
            it = active.erase(it);
          } else {
            ++it;
          }
        for (const int stage : next)
          if (std::find(active.begin(), active.end(), stage) == active.end()) {
            list.push_back({stage, PpActionType::unshard, 0});
            active.push_back(stage);
          }
      }
      list.push_back(a);
      if ((a.type == PpActionType::backward || a.type == PpActionType::backward_weight) &&
          ++weights_done[a.stage] == s.microbatches)
        reduce = a.stage;
    }
    if (reduce >= 0) list.push_back({reduce, PpActionType::reduce_grad, 0});
    for (const int stage : all_at_once ? local : active) list.push_back({stage, PpActionType::reshard, 0});
  }
  return out;
}

std::set<int> pp_stages_kept_between_runs(const PpSchedule& s, int rank) {
  const std::vector<PpAction>& list = s.actions.at(static_cast<size_t>(rank));
  const auto first = std::find_if(list.begin(), list.end(), [](const PpAction& a) { return is_compute(a.type); });
  const auto last = std::find_if(list.rbegin(), list.rend(), [](const PpAction& a) { return is_compute(a.type); });
  std::set<int> leading, kept;
  for (auto it = list.begin(); it != first; ++it)
    if (it->type == PpActionType::unshard) leading.insert(it->stage);
  for (auto it = list.rbegin(); it != last; ++it)
    if (it->type == PpActionType::reshard && leading.contains(it->stage)) kept.insert(it->stage);
  return kept;
}

PpSchedule make_pp_schedule(PpScheduleKind kind, int ranks, int microbatches, int stages_per_rank) {
  const std::string_view name = pp_schedule_name(kind);
  MT_CHECK(ranks >= 1 && ranks <= kMaxRanks, "pp = {}: the pipeline needs 1 to {} ranks", ranks, kMaxRanks);
  MT_CHECK(microbatches >= 1 && microbatches <= kMaxMicrobatches, "pp_microbatches = {}: give 1 to {}", microbatches,
           kMaxMicrobatches);
  MT_CHECK(stages_per_rank >= 1 && stages_per_rank <= kMaxStagesPerRank, "pp_stages_per_rank = {}: give 1 to {}",
           stages_per_rank, kMaxStagesPerRank);
  MT_CHECK(int64_t{ranks} * stages_per_rank * microbatches * 3 <= kMaxActions,
           "pp {} x pp_stages_per_rank {} x pp_microbatches {} is more than {} actions to schedule", ranks,
           stages_per_rank, microbatches, kMaxActions);
  const bool one_stage_each = kind == PpScheduleKind::gpipe || kind == PpScheduleKind::one_f_one_b;
  MT_CHECK(!one_stage_each || stages_per_rank == 1,
           "pp_schedule {} runs one stage per rank, but pp_stages_per_rank = {}; use interleaved_1f1b, "
           "zero_bubble or zbv for several",
           name, stages_per_rank);
  MT_CHECK(kind != PpScheduleKind::interleaved_1f1b || stages_per_rank >= 2,
           "pp_schedule interleaved_1f1b needs pp_stages_per_rank >= 2 (got {}); with one stage per rank it is "
           "1f1b",
           stages_per_rank);
  MT_CHECK(kind != PpScheduleKind::zbv || stages_per_rank == 2,
           "pp_schedule zbv puts exactly 2 stages on each rank (a V), but pp_stages_per_rank = {}", stages_per_rank);
  MT_CHECK(kind != PpScheduleKind::one_f_one_b || microbatches >= ranks,
           "pp_schedule 1f1b needs pp_microbatches >= pp (got {} microbatches for {} stages): with fewer, no "
           "backward can start before every forward is done; raise pp_microbatches or use gpipe",
           microbatches, ranks);
  const bool depth_first_order = kind == PpScheduleKind::interleaved_1f1b || kind == PpScheduleKind::zero_bubble;
  if (depth_first_order && stages_per_rank > 1) {
    const int rounds = std::max(1, microbatches / ranks);
    MT_CHECK(microbatches % rounds == 0,
             "pp_schedule {} takes microbatches in equal runs of about pp = {}: pp_microbatches = {} splits into "
             "{} runs unevenly; use a multiple of pp, or fewer than 2 x pp",
             name, ranks, microbatches, rounds);
  }

  PpSchedule s;
  s.kind = kind;
  s.ranks = ranks;
  s.stages_per_rank = stages_per_rank;
  s.microbatches = microbatches;
  s.rank_of_stage.resize(static_cast<size_t>(s.stages()));
  for (int stage = 0; stage < s.stages(); ++stage)
    s.rank_of_stage[static_cast<size_t>(stage)] =
        kind == PpScheduleKind::zbv && stage >= ranks ? 2 * ranks - 1 - stage : stage % ranks;
  s.actions.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    RankBuilder b{r, s.actions[static_cast<size_t>(r)], {}, {}, {}};
    switch (kind) {
      case PpScheduleKind::gpipe:
        gpipe(b, microbatches);
        break;
      case PpScheduleKind::one_f_one_b:
        one_f_one_b(b, ranks, microbatches);
        break;
      case PpScheduleKind::interleaved_1f1b:
        depth_first(b, ranks, stages_per_rank, microbatches, false);
        break;
      case PpScheduleKind::zero_bubble:
        depth_first(b, ranks, stages_per_rank, microbatches, true);
        break;
      case PpScheduleKind::zbv:
        zbv(b, ranks, microbatches);
        break;
      case PpScheduleKind::csv:
        throw InvalidArgument("pp_schedule csv is read from a file (parallel.pp_schedule_csv), not generated");
    }
  }
  // The requests above are all a caller can get wrong: a generated schedule
  // that breaks the rules is the generator's bug.
  try {
    validate_pp_schedule(s);
  } catch (const InvalidArgument& e) {
    throw InternalError(
        fmt::format("internal error: pp_schedule {} (pp {}, {} microbatches, {} stages per rank) "
                    "generated an invalid schedule: {}",
                    name, ranks, microbatches, stages_per_rank, e.what()));
  }
  return s;
}

void validate_pp_schedule(const PpSchedule& s) {
  const int stages = s.stages(), m = s.microbatches;
  MT_CHECK(static_cast<int>(s.rank_of_stage.size()) == stages && static_cast<int>(s.actions.size()) == s.ranks,
           "pipeline schedule: {} stages on {} ranks, but {} stage placements and {} action lists", stages, s.ranks,
           s.rank_of_stage.size(), s.actions.size());
  // Per (stage, microbatch): how many of each compute type, in this rank's order.
  std::vector<std::array<int, 4>> seen(static_cast<size_t>(stages) * static_cast<size_t>(m), {0, 0, 0, 0});
  for (int r = 0; r < s.ranks; ++r) {
    for (const PpAction& a : s.actions[static_cast<size_t>(r)]) {
      if (!is_compute(a.type)) continue;
      MT_CHECK(a.stage >= 0 && a.stage < stages && a.microbatch >= 0 && a.microbatch < m,
               "pipeline schedule: rank {} has {}, outside {} stages x {} microbatches", r, to_string(a), stages, m);
      MT_CHECK(s.rank_of_stage[static_cast<size_t>(a.stage)] == r,
               "pipeline schedule: rank {} runs {}, but stage {} lives on rank {}", r, to_string(a), a.stage,
               s.rank_of_stage[static_cast<size_t>(a.stage)]);
      auto& c = seen[static_cast<size_t>(a.stage) * static_cast<size_t>(m) + static_cast<size_t>(a.microbatch)];
      const int t = static_cast<int>(a.type);
      MT_CHECK(c[static_cast<size_t>(t)] == 0, "pipeline schedule: rank {} runs {} twice", r, to_string(a));
      const bool forward_done = c[0] == 1, input_done = c[1] == 1 || c[3] == 1;
      MT_CHECK(a.type == PpActionType::forward || forward_done,
               "pipeline schedule: rank {} runs {} before that microbatch's forward", r, to_string(a));
      MT_CHECK(a.type != PpActionType::backward_weight || c[1] == 1,
               "pipeline schedule: rank {} runs {} before its input backward (I)", r, to_string(a));
      MT_CHECK(!((a.type == PpActionType::backward_input || a.type == PpActionType::backward) && input_done),
               "pipeline schedule: rank {} runs {} after that microbatch's backward", r, to_string(a));
      c[static_cast<size_t>(t)] = 1;
    }
  }
  for (int stage = 0; stage < stages; ++stage)
    for (int mb = 0; mb < m; ++mb) {
      const auto& c = seen[static_cast<size_t>(stage) * static_cast<size_t>(m) + static_cast<size_t>(mb)];
      const bool complete =
          c[0] == 1 && ((c[3] == 1 && c[1] == 0 && c[2] == 0) || (c[3] == 0 && c[1] == 1 && c[2] == 1));
      MT_CHECK(complete,
               "pipeline schedule: stage {} microbatch {} has {} F, {} B, {} I and {} W; it needs one F and "
               "either one B or one I and one W",
               stage, mb, c[0], c[3], c[1], c[2]);
    }
}

PpSchedule add_pp_communication(const PpSchedule& compute_only) {
  validate_pp_schedule(compute_only);
  const PpSchedule& s = compute_only;
  const int last = s.stages() - 1;
  auto rank_of = [&](int stage) { return s.rank_of_stage[static_cast<size_t>(stage)]; };
  PpSchedule out = s;
  for (auto& list : out.actions) list.clear();
  // Every action of a stage goes into its rank's list (a receive into the
  // receiving stage's), so one flag per action says whether its rank has it.
  ActionFlags emitted(s.stages(), s.microbatches);
  std::vector<size_t> next(static_cast<size_t>(s.ranks), 0);
  auto emit = [&](int r, const PpAction& a) {
    out.actions[static_cast<size_t>(r)].push_back(a);
    emitted.set(a);
  };
  auto has = [&](int r, int stage, PpActionType type, int mb) {
    MT_ASSERT(rank_of(stage) == r, "stage {} lives on rank {}, not {}", stage, rank_of(stage), r);
    return emitted.has(stage, type, mb);
  };
  for (;;) {
    bool progress = false, left = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = s.actions[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      if (i >= list.size()) continue;
      left = true;
      const PpAction& a = list[i];
      bool ready = true;
      if (a.type == PpActionType::forward && a.stage > 0)
        ready = rank_of(a.stage - 1) == r ? has(r, a.stage - 1, PpActionType::forward, a.microbatch)
                                          : has(r, a.stage, PpActionType::recv_f, a.microbatch);
      if ((a.type == PpActionType::backward || a.type == PpActionType::backward_input) && a.stage < last)
        ready = rank_of(a.stage + 1) == r ? has(r, a.stage + 1, PpActionType::backward, a.microbatch) ||
                                                has(r, a.stage + 1, PpActionType::backward_input, a.microbatch)
                                          : has(r, a.stage, PpActionType::recv_b, a.microbatch);
      if (!ready) continue;
      emit(r, a);
      ++i;
      progress = true;
      if (a.type == PpActionType::forward && a.stage < last && rank_of(a.stage + 1) != r) {
        emit(r, {a.stage, PpActionType::send_f, a.microbatch});
        emit(rank_of(a.stage + 1), {a.stage + 1, PpActionType::recv_f, a.microbatch});
      }
      if ((a.type == PpActionType::backward || a.type == PpActionType::backward_input) && a.stage > 0 &&
          rank_of(a.stage - 1) != r) {
        emit(r, {a.stage, PpActionType::send_b, a.microbatch});
        emit(rank_of(a.stage - 1), {a.stage - 1, PpActionType::recv_b, a.microbatch});
      }
    }
    if (!left) break;
    MT_CHECK(progress,
             "pipeline schedule {} (pp {}, {} microbatches) cannot proceed: {} each wait for an input "
             "no rank will produce",
             pp_schedule_name(s.kind), s.ranks, s.microbatches, describe_stuck(s.actions, next));
  }
  // Run the lists in order, a receive blocking until its send is posted.
  ActionFlags sent(s.stages(), s.microbatches);
  std::fill(next.begin(), next.end(), 0);
  for (;;) {
    bool progress = false, left = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = out.actions[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      for (; i < list.size(); ++i) {
        const PpAction& a = list[i];
        if (a.type == PpActionType::recv_f && !sent.has(a.stage - 1, PpActionType::send_f, a.microbatch)) break;
        if (a.type == PpActionType::recv_b && !sent.has(a.stage + 1, PpActionType::send_b, a.microbatch)) break;
        if (a.type == PpActionType::send_f || a.type == PpActionType::send_b) sent.set(a);
        progress = true;
      }
      left = left || i < list.size();
    }
    if (!left) break;
    MT_CHECK(progress,
             "pipeline schedule {} (pp {}, {} microbatches) deadlocks: {} each wait for a send that "
             "comes after it",
             pp_schedule_name(s.kind), s.ranks, s.microbatches, describe_stuck(out.actions, next));
  }
  return out;
}

PpSimulation simulate_pp_schedule(const PpSchedule& s, const PpCosts& costs) {
  // A rank's v stages each run in 1/v of the costs given for the rank.
  const double v = s.stages_per_rank;
  return simulate_pp_schedule(
      s, std::vector<PpCosts>(static_cast<size_t>(s.stages()),
                              {costs.forward / v, costs.backward_input / v, costs.backward_weight / v, costs.p2p}));
}

namespace {

void check_pp_costs(const PpSchedule& s, const std::vector<PpCosts>& per_stage,
                    const std::vector<double>& speed_when_busy) {
  MT_CHECK(static_cast<int>(per_stage.size()) == s.stages(), "pipeline costs: {} stages' costs for {} stages",
           per_stage.size(), s.stages());
  for (const PpCosts& costs : per_stage)
    MT_CHECK(std::isfinite(costs.forward) && std::isfinite(costs.backward_input) &&
                 std::isfinite(costs.backward_weight) && std::isfinite(costs.p2p) && costs.forward > 0 &&
                 costs.backward_input > 0 && costs.backward_weight > 0 && costs.p2p >= 0,
             "pipeline costs must be finite, positive (p2p may be 0): F {} I {} W {} p2p {}", costs.forward,
             costs.backward_input, costs.backward_weight, costs.p2p);
  MT_CHECK(speed_when_busy.empty() || std::ssize(speed_when_busy) == s.ranks,
           "pipeline speeds: {} for {} ranks (one per count of ranks computing at once)", speed_when_busy.size(),
           s.ranks);
  for (const double speed : speed_when_busy)
    MT_CHECK(std::isfinite(speed) && speed > 0, "pipeline speeds must be finite and positive: {}", speed);
}

// One simulated run of a schedule's compute actions: when each ends, and
// what each rank has done so far.
class PpRun {
 public:
  PpRun(const PpSchedule& s, const std::vector<PpCosts>& per_stage) : s_(s), per_stage_(per_stage) {
    const size_t cells = static_cast<size_t>(s.stages()) * static_cast<size_t>(s.microbatches);
    forward_end_.assign(cells, kNotYet);
    input_end_.assign(cells, kNotYet);
    const auto ranks = static_cast<size_t>(s.ranks);
    compute_.resize(ranks);
    for (size_t r = 0; r < ranks; ++r)
      for (const PpAction& a : s.actions[r])
        if (is_compute(a.type)) compute_[r].push_back(a);
    next_.assign(ranks, 0);
    free_at_.assign(ranks, 0);
    sim_.busy.assign(ranks, 0);
    sim_.timeline.resize(ranks);
  }

  // Events in time order: each rank starts its next action once its inputs
  // are there, and all the ranks computing at once run at the speed for
  // their count (processor sharing: ranks of one host's cores).
  void run_shared(const std::vector<double>& speed_when_busy);
  // The same where every rank runs at `speed` whatever the others do: each
  // action starts when its rank is free and its inputs are there, so each
  // rank runs ahead until it waits on an input, and the rank that makes
  // that input wakes it.
  void run_at(double speed);
  PpSimulation finish();

 private:
  static constexpr double kNotYet = -1;
  size_t at(int stage, int mb) const {
    return static_cast<size_t>(stage) * static_cast<size_t>(s_.microbatches) + static_cast<size_t>(mb);
  }
  int rank_of(int stage) const { return s_.rank_of_stage[static_cast<size_t>(stage)]; }
  double length(const PpAction& a) const { return duration(a, per_stage_[static_cast<size_t>(a.stage)]); }
  // When each input is there for `a` on rank r, or kNotYet.
  double ready_at(int r, const PpAction& a) const;
  // Rank r's next action ran from start to end.
  void done(size_t r, double start, double end);

  const PpSchedule& s_;
  const std::vector<PpCosts>& per_stage_;
  std::vector<double> forward_end_, input_end_;
  std::vector<std::vector<PpAction>> compute_;
  std::vector<size_t> next_;
  std::vector<double> free_at_;
  PpSimulation sim_;
};

double PpRun::ready_at(int r, const PpAction& a) const {
  // `end` on stage `stage`'s rank, plus the hop over the link between stages `link` and `link` + 1 when that
  // rank is another: the activation forward and its gradient back cross the same link.
  auto from = [&](double end, int stage, int link) {
    return end < 0 ? kNotYet : end + (rank_of(stage) != r ? per_stage_[static_cast<size_t>(link)].p2p : 0);
  };
  switch (a.type) {
    case PpActionType::forward:
      return a.stage == 0 ? 0 : from(forward_end_[at(a.stage - 1, a.microbatch)], a.stage - 1, a.stage - 1);
    case PpActionType::backward:
    case PpActionType::backward_input: {
      const double own = forward_end_[at(a.stage, a.microbatch)];
      if (own < 0) return kNotYet;
      if (a.stage == s_.stages() - 1) return own;
      const double next_stage = from(input_end_[at(a.stage + 1, a.microbatch)], a.stage + 1, a.stage);
      return next_stage < 0 ? kNotYet : std::max(own, next_stage);
    }
    default:  // W: after its own I, which runs earlier on this rank
      return input_end_[at(a.stage, a.microbatch)];
  }
}

void PpRun::done(size_t r, double start, double end) {
  const PpAction& a = compute_[r][next_[r]++];
  free_at_[r] = end;
  sim_.busy[r] += end - start;
  sim_.timeline[r].push_back({a, start, end});
  if (a.type == PpActionType::forward) forward_end_[at(a.stage, a.microbatch)] = end;
  if (a.type == PpActionType::backward || a.type == PpActionType::backward_input)
    input_end_[at(a.stage, a.microbatch)] = end;
}

void PpRun::run_shared(const std::vector<double>& speed_when_busy) {
  const size_t ranks = compute_.size();
  std::vector<double> left(ranks, 0), length_of(ranks, 0), started(ranks, 0);
  std::vector<bool> running(ranks, false);
  double now = 0;
  for (;;) {
    double soonest_ready = std::numeric_limits<double>::infinity();
    int computing = 0;
    for (size_t r = 0; r < ranks; ++r) {
      if (!running[r] && next_[r] < compute_[r].size()) {
        const PpAction& a = compute_[r][next_[r]];
        const double ready = ready_at(static_cast<int>(r), a);
        if (ready >= 0 && ready <= now) {
          running[r] = true;
          started[r] = now;
          left[r] = length_of[r] = length(a);
        } else if (ready > now) {
          soonest_ready = std::min(soonest_ready, ready);
        }
      }
      computing += running[r] ? 1 : 0;
    }
    if (computing == 0 && std::isinf(soonest_ready)) break;
    const double speed = speed_when_busy[static_cast<size_t>(std::max(computing, 1) - 1)];
    double step = soonest_ready - now;
    for (size_t r = 0; r < ranks; ++r)
      if (running[r]) step = std::min(step, left[r] / speed);
    const double then = now + step;
    for (size_t r = 0; r < ranks; ++r) {
      if (!running[r]) continue;
      left[r] -= step * speed;
      if (left[r] > 1e-12 * length_of[r]) continue;  // still computing (else done, but for rounding)
      running[r] = false;
      done(r, started[r], then);
    }
    now = then;
  }
}

void PpRun::run_at(double speed) {
  const size_t ranks = compute_.size();
  std::vector<size_t> waking(ranks);
  for (size_t r = 0; r < ranks; ++r) waking[r] = ranks - 1 - r;  // rank 0 first
  std::vector<bool> queued(ranks, true);
  auto wake = [&](int stage) {
    const auto r = static_cast<size_t>(rank_of(stage));
    if (!queued[r]) queued[r] = true, waking.push_back(r);
  };
  while (!waking.empty()) {
    const size_t r = waking.back();
    waking.pop_back();
    queued[r] = false;
    while (next_[r] < compute_[r].size()) {
      const PpAction& a = compute_[r][next_[r]];
      const double ready = ready_at(static_cast<int>(r), a);
      if (ready < 0) break;
      const double start = std::max(free_at_[r], ready);
      done(r, start, start + length(a) / speed);  // `a` stays: the lists do not change
      if (a.type == PpActionType::forward && a.stage + 1 < s_.stages()) wake(a.stage + 1);
      if ((a.type == PpActionType::backward || a.type == PpActionType::backward_input) && a.stage > 0)
        wake(a.stage - 1);
    }
  }
}

PpSimulation PpRun::finish() {
  bool all_done = true;
  for (size_t r = 0; r < compute_.size(); ++r) all_done = all_done && next_[r] == compute_[r].size();
  MT_CHECK(all_done,
           "pipeline schedule {} (pp {}, {} microbatches) cannot proceed: {} each wait for an input "
           "no rank will produce",
           pp_schedule_name(s_.kind), s_.ranks, s_.microbatches, describe_stuck(compute_, next_));
  sim_.makespan = *std::max_element(free_at_.begin(), free_at_.end());
  double busy = 0;
  for (double b : sim_.busy) busy += b;
  sim_.bubble_fraction = sim_.makespan > 0 ? 1 - busy / (sim_.makespan * s_.ranks) : 0;
  // Activations: a (stage, microbatch) is held from its F until its B or W.
  for (const auto& list : compute_) {
    int live = 0, peak = 0;
    for (const PpAction& a : list) {
      if (a.type == PpActionType::forward) peak = std::max(peak, ++live);
      if (a.type == PpActionType::backward || a.type == PpActionType::backward_weight) --live;
    }
    sim_.peak_activations.push_back(peak);
  }
  return std::move(sim_);
}

}  // namespace

PpSimulation simulate_pp_schedule(const PpSchedule& s, const std::vector<PpCosts>& per_stage,
                                  const std::vector<double>& speed_when_busy) {
  validate_pp_schedule(s);
  check_pp_costs(s, per_stage, speed_when_busy);
  PpRun run(s, per_stage);
  const bool one_speed = std::all_of(speed_when_busy.begin(), speed_when_busy.end(),
                                     [&](double speed) { return speed == speed_when_busy.front(); });
  if (one_speed)
    run.run_at(speed_when_busy.empty() ? 1 : speed_when_busy.front());
  else
    run.run_shared(speed_when_busy);
  return run.finish();
}

double published_bubble_fraction(const PpSchedule& s, const PpCosts& c) {
  const double p = s.ranks, m = s.microbatches, v = s.stages_per_rank;
  double idle = -1;
  switch (s.kind) {
    case PpScheduleKind::gpipe:
    case PpScheduleKind::one_f_one_b:
      idle = (p - 1) * (c.forward + c.backward());
      break;
    case PpScheduleKind::interleaved_1f1b:
      idle = (p - 1) * (c.forward + c.backward()) / v;
      break;
    case PpScheduleKind::zero_bubble:
      if (s.stages_per_rank == 1) idle = (p - 1) * (c.forward + c.backward_input - c.backward_weight);
      break;
    case PpScheduleKind::zbv:
    case PpScheduleKind::csv:
      break;
  }
  if (idle < 0) return -1;
  return idle / (m * (c.forward + c.backward()) + idle);
}

std::string pp_timeline_text(const PpSchedule& s, const PpSimulation& sim, double unit) {
  MT_CHECK(unit > 0 && std::isfinite(unit), "pipeline timeline: the time per column must be positive, got {}", unit);
  const auto columns = static_cast<size_t>(std::ceil(sim.makespan / unit - 1e-9));
  MT_CHECK(columns <= 100000, "pipeline timeline: {} columns is too wide to print; give a larger time per column",
           columns);
  size_t width = 1;
  for (const auto& rank : sim.timeline)
    for (const auto& t : rank) width = std::max(width, to_string(t.action).size());
  ++width;
  std::string out;
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<std::string> cell(columns, std::string(width - 1, '.'));
    for (const auto& t : sim.timeline[static_cast<size_t>(r)]) {
      const auto first = static_cast<size_t>(std::llround(t.start / unit));
      const auto end = std::max(first + 1, static_cast<size_t>(std::llround(t.end / unit)));
      for (size_t col = first; col < end && col < columns; ++col) {
        std::string text = col == first ? to_string(t.action) : std::string(width - 1, '-');
        text.resize(width - 1, col == first ? ' ' : '-');
        cell[col] = text;
      }
    }
    out += fmt::format("rank {:>{}} | {}\n", r, fmt::format("{}", s.ranks - 1).size(), fmt::join(cell, " "));
  }
  return out;
}

}  // namespace meshtrain::parallel
