// The run report (`meshtrain report RUN_DIR`): one self-contained HTML page
// (inline SVG and CSS, no script, nothing fetched) of a run's folder: charts
// of its metrics per step, the step's estimate next to its measured time, the
// layout, each rank's table and the config. RUN_DIR is the folder of the
// metrics file, where `meshtrain train` writes run.json (report/run_record.h).
#pragma once

#include <optional>
#include <string>

#include "report/metrics_log.h"
#include "report/run_record.h"

namespace meshtrain::report {

constexpr const char* kRunRecordName = "run.json";
constexpr const char* kReportName = "report.html";
// The metrics file a folder without run.json is looked for under.
constexpr const char* kDefaultMetricsName = "metrics.jsonl";

struct Run {
  std::string dir;
  std::optional<RunRecord> record;  // none: a folder with only a metrics file
  std::string record_path, metrics_path;
  MetricsLog metrics;
};

// The run in folder `dir`: its run.json and the metrics file it names, or
// without run.json its metrics.jsonl alone (with a warning). Throws
// InvalidArgument naming what is missing or malformed.
Run load_run(const std::string& dir);

// The page, as text.
std::string render_report(const Run& run);

}  // namespace meshtrain::report
