// What a training run records of itself for its report: run.json, written
// beside the metrics file by `meshtrain train` (rank 0) when the run starts
// and again when it ends: the resolved config, the layout, every rank's
// table and the step's estimate. Plain data, so that this module needs
// nothing above core.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::report {

// One rank's row of the report's rank table (train::RankReport's figures).
struct RankRow {
  int rank = 0;
  std::string coordinate;  // "dp_shard 1, tp 0"; "" on one rank
  double parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
  double collectives_per_step = 0, collective_bytes_per_step = 0;
  double peak_bytes = 0, step_peak_bytes = 0;
  // A pipeline's last step: bubble (a fraction), activations held at the peak.
  double pipeline_bubble = 0, activation_peak_bytes = 0, activation_peak_pairs = 0;
};

struct RunRecord {
  std::string metrics_file;  // the metrics file's name, in the run folder
  std::string model;         // one line: the model and its parameter count
  std::string config_toml;   // the resolved config, every key
  int world_size = 1;
  std::string layout;  // the mesh and the parameters' layouts ("" on one rank)
  bool pipeline = false;
  std::vector<RankRow> ranks;
  std::string ranks_when;  // "at the start" or "at the end"
  std::string hardware;    // the profile the estimate costs the step on
  std::string estimate_mode;
  double estimated_step_ms = 0;  // 0: none (no_estimate_because says why)
  std::string no_estimate_because;
  std::string status = "running";  // "running", "finished", "stopped by SIGTERM after step 12"
  double median_step_ms = 0;       // at the end: the median of the steps after the first
  int64_t steps_run = 0;           // at the end
};

// The record as run.json's text, and back; parse_run_record throws
// InvalidArgument naming `file` when the text is not such a record.
std::string run_record_json(const RunRecord& record);
RunRecord parse_run_record(const std::string& text, const std::string& file);

}  // namespace meshtrain::report
