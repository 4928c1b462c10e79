#include "cli/pp_schedule_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "parallel/pipeline_schedule.h"

namespace meshtrain::cli {

namespace {
constexpr double kMaxColumns = 2000;  // wider than that is no picture
}  // namespace

int run_pp_schedule(const PpScheduleCommand& c) {
  using namespace parallel;
  PpSchedule schedule;
  if (!c.from_csv.empty()) {
    const std::string text = read_small_file(c.from_csv, kMaxScheduleCsvBytes, "pp-schedule --from-csv");
    try {
      schedule = pp_schedule_from_csv(text, c.stages);  // --stages 0: as many ranks as the file has lines
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("pp-schedule --from-csv {}: {}", c.from_csv, e.what()));
    }
  } else {
    const PpScheduleKind kind = parse_pp_schedule(c.schedule);
    const bool two_by_default = kind == PpScheduleKind::interleaved_1f1b || kind == PpScheduleKind::zbv;
    const int per_rank = c.stages_per_rank != 0 ? c.stages_per_rank : (two_by_default ? 2 : 1);
    try {
      schedule = make_pp_schedule(kind, c.stages != 0 ? c.stages : 4, c.microbatches, per_rank);
    } catch (const InvalidArgument& e) {  // the library names the config keys; here they are flags
      throw InvalidArgument(
          fmt::format("pp-schedule: {} (--stages is pp, --stages-per-rank pp_stages_per_rank, "
                      "--microbatches pp_microbatches)",
                      e.what()));
    }
  }
  if (c.csv) {
    fmt::print("{}", pp_schedule_csv(schedule));
    return 0;
  }
  const PpScheduleKind kind = schedule.kind;
  const int v = schedule.stages_per_rank;
  const PpSchedule lowered = add_pp_communication(schedule);
  const PpCosts costs{c.forward, c.backward_input, c.backward_weight, c.p2p};
  const PpSimulation sim = simulate_pp_schedule(schedule, costs);
  const double published = published_bubble_fraction(schedule, costs);
  const PpSchedule& listed = c.comms ? lowered : schedule;
  MT_CHECK(c.max_active_stages >= 0 && c.max_active_stages <= 64,
           "pp-schedule --max-active-stages {}: give 0 (all of a rank's stages) to 64", c.max_active_stages);
  MT_CHECK(c.max_active_stages == 0 || c.fsdp, "pp-schedule --max-active-stages limits FSDP's gathers: add --fsdp");
  const PpSchedule shown = c.fsdp ? add_pp_fsdp_actions(listed, c.max_active_stages) : listed;
  if (c.json) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int r = 0; r < schedule.ranks; ++r) {
      nlohmann::ordered_json actions = nlohmann::ordered_json::array();
      for (const PpAction& a : shown.actions[static_cast<size_t>(r)]) actions.push_back(to_string(a));
      nlohmann::ordered_json timed = nlohmann::ordered_json::array();
      for (const PpTimedAction& t : sim.timeline[static_cast<size_t>(r)])
        timed.push_back({{"action", to_string(t.action)}, {"start", t.start}, {"end", t.end}});
      ranks.push_back({{"rank", r},
                       {"actions", actions},
                       {"timeline", timed},
                       {"busy", sim.busy[static_cast<size_t>(r)]},
                       {"peak_activations", sim.peak_activations[static_cast<size_t>(r)]}});
    }
    nlohmann::ordered_json out{
        {"schedule", pp_schedule_name(kind)},
        {"pp", schedule.ranks},
        {"stages_per_rank", v},
        {"microbatches", schedule.microbatches},
        {"stage_rank", schedule.rank_of_stage},
        {"makespan", sim.makespan},
        {"bubble_fraction", sim.bubble_fraction},
        {"published_bubble_fraction", published < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(published)},
        {"ranks", ranks}};
    fmt::print("{}\n", out.dump(1));
    return 0;
  }
  fmt::print(
      "pipeline schedule {}: pp {}, {} stage{} per rank ({} stages), {} microbatches; F {} I {} W {} p2p {} "
      "(one stage's forward of one microbatch = 1; a rank's stage takes 1/{} of it)\n",
      pp_schedule_name(kind), schedule.ranks, v, v > 1 ? "s" : "", schedule.stages(), schedule.microbatches, c.forward,
      c.backward_input, c.backward_weight, c.p2p, v);
  fmt::print(
      "actions per rank{} (stage, F forward / B backward / I input backward / W weight backward, "
      "microbatch{}):\n",
      c.comms ? ", with the sends and receives in the order each rank posts them" : "",
      c.fsdp ? "; FSDP's UNSHARD, REDUCE_GRAD and RESHARD of a stage" : "");
  for (int r = 0; r < schedule.ranks; ++r) {
    std::vector<std::string> parts;
    for (const PpAction& a : shown.actions[static_cast<size_t>(r)]) parts.push_back(to_string(a));
    fmt::print("  rank {}: {}\n", r, fmt::join(parts, " "));
  }
  double unit = c.forward;
  for (double d : {c.backward_input, c.backward_weight}) unit = std::min(unit, d);
  unit /= v;
  if (const double columns = sim.makespan / unit; columns <= kMaxColumns)
    fmt::print("timeline (a column per {:g}; '.' idle):\n{}", unit, pp_timeline_text(schedule, sim, unit));
  else
    fmt::print("timeline: {:.0f} columns of {:g}, too wide to draw (--json gives each action's start and end)\n",
               columns, unit);
  fmt::print("step {:g}; bubble {:.4f} of the ranks' time", sim.makespan, sim.bubble_fraction);
  if (published >= 0)
    fmt::print(" (published formula: {:.4f})\n", published);
  else
    fmt::print(" (no closed form published for {}{})\n", pp_schedule_name(kind),
               kind == PpScheduleKind::zero_bubble ? " with several stages per rank" : "");
  fmt::print("activations held at the peak, per rank ((stage, microbatch) pairs; / {} for whole-stage units): {}\n", v,
             fmt::join(sim.peak_activations, ", "));
  fmt::print("sends and receives: checked to run in order on every rank without deadlock\n");
  return 0;
}

Command add_pp_schedule_command(CLI::App& app) {
  auto cmd = std::make_shared<PpScheduleCommand>();
  CLI::App* pp =
      app.add_subcommand("pp-schedule",
                         "Print a pipeline schedule's actions per rank, its simulated timeline, its bubble next to the "
                         "published formula and the activations each rank holds; the sends and receives are checked "
                         "to run without deadlock");
  pp->add_option("--schedule", cmd->schedule, "gpipe, 1f1b, interleaved_1f1b, zero_bubble or zbv")
      ->capture_default_str();
  pp->add_option("--from-csv", cmd->from_csv,
                 "A schedule of one's own instead of --schedule: a line per pipeline rank of its compute actions in "
                 "order (0F0,0F1,0B0,...), as parallel.pp_schedule_csv takes it; its stages per rank and "
                 "microbatches are read from it");
  pp->add_option("--stages", cmd->stages,
                 "Pipeline ranks (pp); the model has pp x stages-per-rank stages (default: 4, or --from-csv's lines)")
      ->check(CLI::Range(1, 1 << 20));
  pp->add_option("--stages-per-rank", cmd->stages_per_rank,
                 "Stages on each rank (virtual stages): 1 for gpipe and 1f1b, at least 2 for interleaved_1f1b, "
                 "exactly 2 for zbv, any for zero_bubble (default: 2 for interleaved_1f1b and zbv, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  pp->add_option("--microbatches", cmd->microbatches, "Microbatches per step")->capture_default_str();
  pp->add_option("--forward", cmd->forward, "Time of one stage's forward of one microbatch")->capture_default_str();
  pp->add_option("--backward-input", cmd->backward_input,
                 "Time of its backward for the stage's input (I; a full backward B is I + W)")
      ->capture_default_str();
  pp->add_option("--backward-weight", cmd->backward_weight, "Time of its backward for the stage's weights (W)")
      ->capture_default_str();
  pp->add_option("--p2p", cmd->p2p, "Time of a send between stages on different ranks")->capture_default_str();
  pp->add_flag("--comms", cmd->comms, "List the actions with their sends and receives");
  pp->add_flag("--fsdp", cmd->fsdp,
               "List the actions with FSDP's too: UNSHARD of each stage first, REDUCE_GRAD after its last weight "
               "gradients, RESHARD last (with --comms: with the sends and receives too)");
  pp->add_option("--max-active-stages", cmd->max_active_stages,
                 "With --fsdp: at most this many of a rank's stages gathered at once, each gathered ahead of its "
                 "next use and dropped when another is needed (parallel.pp_max_active_stages; 0: all, for the step)")
      ->capture_default_str();
  pp->add_flag("--json", cmd->json, "Print JSON");
  pp->add_flag("--csv", cmd->csv,
               "Print only the compute actions, a line per rank, as parallel.pp_schedule_csv and --from-csv take "
               "them (a schedule to edit and run)");

  return {pp, [cmd] { return run_pp_schedule(*cmd); }};
}

}  // namespace meshtrain::cli
