#include "report/run_record.h"

#include <nlohmann/json.hpp>
#include <type_traits>

#include "core/error.h"

namespace meshtrain::report {

namespace {

constexpr const char* kFormat = "meshtrain run record 1";

nlohmann::ordered_json rank_json(const RankRow& r) {
  return {{"rank", r.rank},
          {"coordinate", r.coordinate},
          {"parameter_bytes", r.parameter_bytes},
          {"gradient_bytes", r.gradient_bytes},
          {"optimizer_state_bytes", r.optimizer_state_bytes},
          {"collectives_per_step", r.collectives_per_step},
          {"collective_bytes_per_step", r.collective_bytes_per_step},
          {"peak_bytes", r.peak_bytes},
          {"step_peak_bytes", r.step_peak_bytes},
          {"pipeline_bubble", r.pipeline_bubble},
          {"activation_peak_bytes", r.activation_peak_bytes},
          {"activation_peak_pairs", r.activation_peak_pairs}};
}

// A field of `j` into `out` when present (a missing one keeps its default:
// records of older versions load); a present one of the wrong type throws.
template <typename T>
void get(const nlohmann::json& j, const char* key, T& out, const std::string& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)  // a float would convert: 1e300 to an int is UB
    MT_CHECK(it->is_number_integer(), "{}: \"{}\" is {}, not an integer", file, key, it->dump());
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument(fmt::format("{}: \"{}\" is {}, not what a run record holds there", file, key, it->dump()));
  }
}

RankRow parse_rank(const nlohmann::json& j, const std::string& file) {
  MT_CHECK(j.is_object(), "{}: an entry of \"ranks\" is {}, not an object", file, j.dump());
  RankRow r;
  get(j, "rank", r.rank, file);
  get(j, "coordinate", r.coordinate, file);
  get(j, "parameter_bytes", r.parameter_bytes, file);
  get(j, "gradient_bytes", r.gradient_bytes, file);
  get(j, "optimizer_state_bytes", r.optimizer_state_bytes, file);
  get(j, "collectives_per_step", r.collectives_per_step, file);
  get(j, "collective_bytes_per_step", r.collective_bytes_per_step, file);
  get(j, "peak_bytes", r.peak_bytes, file);
  get(j, "step_peak_bytes", r.step_peak_bytes, file);
  get(j, "pipeline_bubble", r.pipeline_bubble, file);
  get(j, "activation_peak_bytes", r.activation_peak_bytes, file);
  get(j, "activation_peak_pairs", r.activation_peak_pairs, file);
  return r;
}

}  // namespace

std::string run_record_json(const RunRecord& r) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankRow& row : r.ranks) ranks.push_back(rank_json(row));
  const nlohmann::ordered_json j{{"format", kFormat},
                                 {"status", r.status},
                                 {"metrics_file", r.metrics_file},
                                 {"model", r.model},
                                 {"world_size", r.world_size},
                                 {"layout", r.layout},
                                 {"pipeline", r.pipeline},
                                 {"estimate",
                                  {{"hardware", r.hardware},
                                   {"mode", r.estimate_mode},
                                   {"step_ms", r.estimated_step_ms},
                                   {"none_because", r.no_estimate_because}}},
                                 {"median_step_ms", r.median_step_ms},
                                 {"steps_run", r.steps_run},
                                 {"ranks_when", r.ranks_when},
                                 {"ranks", ranks},
                                 {"config_toml", r.config_toml}};
  return j.dump(2) + "\n";
}

RunRecord parse_run_record(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw InvalidArgument(
        fmt::format("{} is not JSON ({}); meshtrain train writes it beside the metrics file", file, e.what()));
  }
  const auto format = j.is_object() ? j.find("format") : j.end();
  MT_CHECK(format != j.end() && format->is_string() && *format == kFormat,
           "{} is not a meshtrain run record (no \"format\": \"{}\"); meshtrain train writes one beside the metrics "
           "file",
           file, kFormat);
  RunRecord r;
  get(j, "status", r.status, file);
  get(j, "metrics_file", r.metrics_file, file);
  get(j, "model", r.model, file);
  get(j, "world_size", r.world_size, file);
  get(j, "layout", r.layout, file);
  get(j, "pipeline", r.pipeline, file);
  get(j, "median_step_ms", r.median_step_ms, file);
  get(j, "steps_run", r.steps_run, file);
  get(j, "ranks_when", r.ranks_when, file);
  get(j, "config_toml", r.config_toml, file);
  if (const auto e = j.find("estimate"); e != j.end() && e->is_object()) {
    get(*e, "hardware", r.hardware, file);
    get(*e, "mode", r.estimate_mode, file);
    get(*e, "step_ms", r.estimated_step_ms, file);
    get(*e, "none_because", r.no_estimate_because, file);
  }
  if (const auto ranks = j.find("ranks"); ranks != j.end() && !ranks->is_null()) {
    MT_CHECK(ranks->is_array(), "{}: \"ranks\" is not a list", file);
    for (const nlohmann::json& row : *ranks) r.ranks.push_back(parse_rank(row, file));
  }
  MT_CHECK(r.world_size >= 1, "{}: \"world_size\" is {}, not a count of ranks", file, r.world_size);
  return r;
}

}  // namespace meshtrain::report
