// `meshtrain report RUN_DIR [-o FILE]`: a run's report page (report/report.h),
// and what `meshtrain train` writes for it beside the metrics file: run.json
// when the run starts and again when it ends, report.html at the end.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "report/run_record.h"
#include "train/trainer.h"

namespace meshtrain::cli {

// Added to `app` with its options.
Command add_report_command(CLI::App& app);

// The run files of a training run on rank 0: run.json and report.html in the
// folder of metrics.file. Inactive (every call does nothing) when
// metrics.file is not set. The constructor checks that the files may be
// written there (none may replace an input of the run) before any step.
class TrainReport {
 public:
  explicit TrainReport(const train::Trainer& trainer);
  bool active() const { return !record_path_.empty(); }
  // run.json as the run starts: config, layout, estimate, each rank's table.
  void started(const std::vector<train::RankReport>& ranks);
  // run.json with the ranks' tables at the end and how the run ended, then
  // report.html from it and the metrics; returns report.html's path ("" when inactive).
  std::string ended(const std::string& status, const train::Trainer::Summary* summary,
                    const std::vector<train::RankReport>& ranks);
  // After the run failed with `error`: run.json and report.html as far as
  // they can be written (a failure to is passed over: the error is the news).
  void failed(const std::string& error) noexcept;

 private:
  const train::Trainer& trainer_;
  std::string dir_, record_path_, report_path_;
  report::RunRecord record_;
};

}  // namespace meshtrain::cli
