// Pipeline-parallel schedules as lists of actions per rank: generated for
// GPipe, 1F1B, interleaved 1F1B, zero-bubble (ZB-H1, interleaved when a rank
// holds several stages) and ZB-V; lowered with the sends and receives between
// ranks in one order both sides agree on; checked for counts, dependency
// order and deadlock; and simulated with per-action costs for the bubble, the
// activations each rank holds and a printable timeline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::parallel {

// csv: a schedule read from a file (pp_schedule_from_csv), not generated.
enum class PpScheduleKind { gpipe, one_f_one_b, interleaved_1f1b, zero_bubble, zbv, csv };
std::string_view pp_schedule_name(PpScheduleKind kind);  // "gpipe", "1f1b", ...
// Throws InvalidArgument listing the names when `name` is none of them.
PpScheduleKind parse_pp_schedule(std::string_view name);
std::string pp_schedule_names();  // "gpipe, 1f1b, interleaved_1f1b, zero_bubble, zbv" (the generated ones)

// F: forward; I: backward for the stage's inputs; W: backward for its
// weights; B: both at once. Sends and receives carry activations (F) forward
// and their gradients (B) back between stages on different ranks. With FSDP
// (add_pp_fsdp_actions): UNSHARD gathers a stage's parameters, RESHARD drops
// the gathered copies, REDUCE_GRAD reduces the stage's summed gradients.
enum class PpActionType : uint8_t {
  forward,
  backward_input,
  backward_weight,
  backward,
  send_f,
  recv_f,
  send_b,
  recv_b,
  unshard,
  reshard,
  reduce_grad
};

struct PpAction {
  int stage = 0;
  PpActionType type = PpActionType::forward;
  int microbatch = 0;
  bool operator==(const PpAction&) const = default;
};
// "2F0", "1I3", "0SEND_F1": stage, type, microbatch; "1UNSHARD", "0REDUCE_GRAD": no microbatch.
std::string to_string(const PpAction& action);
// The inverse of to_string; throws InvalidArgument naming the text.
PpAction parse_pp_action(std::string_view text);
bool is_compute(PpActionType type);

struct PpSchedule {
  PpScheduleKind kind = PpScheduleKind::one_f_one_b;
  int ranks = 1;
  int stages_per_rank = 1;
  int microbatches = 1;
  std::vector<int> rank_of_stage;              // stage -> rank
  std::vector<std::vector<PpAction>> actions;  // per rank, in the order it runs them
  int stages() const { return ranks * stages_per_rank; }
};

// The compute actions of each rank. Stage s lives on rank s % ranks, except
// for zbv (two stages per rank in a V: rank r holds r and 2*ranks-1-r).
// Throws InvalidArgument naming the key (pp, pp_microbatches,
// pp_stages_per_rank) when the schedule cannot run as asked; InternalError
// if what it generated fails validate_pp_schedule (a bug in the generator).
PpSchedule make_pp_schedule(PpScheduleKind kind, int ranks, int microbatches, int stages_per_rank);

// A schedule from CSV text, one line per rank (`ranks` of them, or 0: as
// many as the lines; blank lines and lines starting with # left out), each a comma-separated list of its
// compute actions in order ("0F0,0F1,1F0,..."; an empty cell is nothing).
// The stages each rank holds, the stages per rank and the microbatches are
// read from the actions (each stage on one rank, every rank the same
// number). Validated as validate_pp_schedule does, and lowered once so that
// a schedule whose ranks would wait on each other forever is refused here;
// throws InvalidArgument naming the line and cell, or the action that breaks
// the schedule, or the ranks that would deadlock.
PpSchedule pp_schedule_from_csv(std::string_view text, int ranks);
constexpr size_t kMaxScheduleCsvBytes = 64 << 20;  // a schedule file read whole is no larger
// A schedule's compute actions as that CSV text.
std::string pp_schedule_csv(const PpSchedule& schedule);

// Every stage on one rank; per stage each microbatch's F once and either B
// once or I then W once, its backward after its forward. Throws naming the
// first action that breaks it.
void validate_pp_schedule(const PpSchedule& schedule);

// The same schedule with SEND/RECV actions: a rank takes its next compute
// action only once its input is there (a local stage's output, or a receive
// already in its list); the send goes into the sender's list and the
// matching receive into the receiver's at the same moment, so every pair of
// ranks sees its transfers in one order. Then run in order with blocking
// receives (sends do not block) to prove it cannot deadlock. Throws naming
// the stuck actions otherwise.
PpSchedule add_pp_communication(const PpSchedule& compute_only);

// The same schedule with FSDP's actions per rank: UNSHARD of each of its
// stages before anything else (each stage's parameters gathered once for
// all its microbatches), REDUCE_GRAD of a stage right after the action that
// completes its last microbatch's weight gradients (and the sends that
// action makes, so the stage before need not wait), and RESHARD of each at
// the end. They talk only within a stage's ranks, so they change no order
// between pipeline ranks. With max_active_stages K (0: every stage of the
// rank) below the stages a rank holds, at most K are gathered at once: at
// each compute action the next K distinct stages to compute stay or become
// gathered (UNSHARD, ahead of their use) and the others are dropped
// (RESHARD), as PyTorch's runtime looks ahead.
PpSchedule add_pp_fsdp_actions(const PpSchedule& schedule, int max_active_stages = 0);
// Of rank `rank`'s list (with FSDP's actions): the stages it gathers before
// its first compute action and drops after its last. When the schedule runs
// several times a step (gradient accumulation) these stay gathered from one
// run to the next; every other UNSHARD happens in every run.
std::set<int> pp_stages_kept_between_runs(const PpSchedule& schedule, int rank);

// Times in units of one stage's forward of one microbatch (a rank with v
// stages runs each in 1/v of that); p2p is added between dependent actions
// on different ranks.
struct PpCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double p2p = 0;
  double backward() const { return backward_input + backward_weight; }
};

struct PpTimedAction {
  PpAction action;
  double start = 0;
  double end = 0;
};

struct PpSimulation {
  double makespan = 0;
  std::vector<double> busy;                          // per rank
  double bubble_fraction = 0;                        // idle / (ranks x makespan)
  std::vector<int> peak_activations;                 // per rank: (stage, microbatch) pairs held at once, F to B or W
  std::vector<std::vector<PpTimedAction>> timeline;  // per rank, compute actions only
};

// Runs the compute actions with their true dependencies (the previous stage's
// forward, the next stage's input backward, this stage's own F before I/B and
// I before W), each rank in its list order.
PpSimulation simulate_pp_schedule(const PpSchedule& schedule, const PpCosts& costs = {});
// The same with each stage's own durations (absolute, in any unit: stages
// of a model differ, the first holding the embedding and the last the head);
// costs[s].p2p is the time one microbatch takes over the link between stage
// s and stage s + 1 on another rank: s's output forward, and its gradient
// back (the same size); the last stage's is unused.
// speed_when_busy (empty, or one per rank count): when k ranks compute at
// once, each runs its actions at speed_when_busy[k - 1] times its costs'
// pace, as ranks sharing one host's cores do (a rank waiting for its input
// leaves its cores to the others).
PpSimulation simulate_pp_schedule(const PpSchedule& schedule, const std::vector<PpCosts>& per_stage,
                                  const std::vector<double>& speed_when_busy = {});

// The published bubble fraction for this schedule and these costs:
// GPipe/1F1B (p-1)(F+B) idle per rank, interleaved (p-1)(F+B)/v, ZB-H1
// (p-1)(F+I-W); each over the makespan m(F+B) + idle. zbv has none
// published beyond "about zero when F = I = W": returns -1.
double published_bubble_fraction(const PpSchedule& schedule, const PpCosts& costs = {});

// One row per rank, a column per `unit` of time, each action's text written
// where it starts and '-' while it runs, '.' where the rank is idle.
std::string pp_timeline_text(const PpSchedule& schedule, const PpSimulation& sim, double unit);

}  // namespace meshtrain::parallel
