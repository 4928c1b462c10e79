#include "cli/report_command.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/file_io.h"
#include "models/llama.h"
#include "report/report.h"

namespace meshtrain::cli {

namespace fs = std::filesystem;

namespace {

// What `meshtrain report --help` says after the options.
constexpr const char* kReportFooter =
    "RUN_DIR is the folder of a run's metrics file (metrics.file), where `meshtrain train` (rank 0) writes run.json\n"
    "as the run starts and again as it ends (the resolved config, the layout, each rank's table, the step's\n"
    "estimate) and report.html at its end. This command writes that page again from run.json and the metrics:\n"
    "one HTML file, inline SVG and CSS, no script and nothing fetched: loss (training, and validation where\n"
    "logged), learning rate, gradient norm, tokens/s, peak memory and step time per logged step (the estimate\n"
    "beside the measured time), the layout, the ranks' tables and the config. A series of more than 1200 points\n"
    "is drawn from each of 599 buckets of consecutive steps' lowest and highest values. A metrics file cut off in\n"
    "its last line (a killed run) is read without that line, with a warning; steps logged again after a resume\n"
    "replace the earlier lines. A folder without run.json but with metrics.jsonl gives a page of the metrics only.\n"
    "The page is written whole or not at all; -o may not name run.json or the metrics file.";

struct ReportArgs {
  std::string dir, out;
};

int run_report(const ReportArgs& a) {
  const report::Run run = report::load_run(a.dir);
  const std::string out = a.out.empty() ? (fs::path(a.dir) / report::kReportName).string() : a.out;
  check_not_an_input(out, "-o", {{run.record_path, "RUN_DIR's run.json"}, {run.metrics_path, "the metrics file"}});
  check_output_file(out, "-o");
  const std::string html = report::render_report(run);
  write_file_atomically(out, html);
  for (const std::string& w : run.metrics.warnings) fmt::print(stderr, "meshtrain report: warning: {}\n", w);
  fmt::print("report: {} logged steps of {} to {} ({:.1f} KiB)\n", run.metrics.points.size(), a.dir, out,
             static_cast<double>(html.size()) / 1024);
  return 0;
}

std::string model_line(const train::Trainer& t) {
  const config::TrainConfig& c = t.config();
  return fmt::format("{}: {:.2f}M parameters; batch {} x seq {}, {} steps, {} compute, {:.1f} GFLOP/step",
                     models::describe(c.model), static_cast<double>(t.parameter_count()) / 1e6, c.data.batch_size,
                     c.data.seq_len, c.training.steps, dtype_name(c.training.dtype), t.flops_per_step() / 1e9);
}

std::vector<report::RankRow> rank_rows(const train::Trainer& t, const std::vector<train::RankReport>& reports) {
  std::vector<report::RankRow> rows;
  for (const train::RankReport& r : reports) {
    std::vector<std::string> parts;  // the mesh dims of more than one rank
    for (int m = 0; t.num_ranks() > 1 && m < t.mesh().ndim(); ++m)
      if (t.mesh().size(m) > 1)
        parts.push_back(fmt::format("{} {}", t.mesh().names()[static_cast<size_t>(m)], r.coordinate.at(m)));
    rows.push_back({r.rank, fmt::format("{}", fmt::join(parts, ", ")), r.parameter_bytes, r.gradient_bytes,
                    r.optimizer_state_bytes, r.collectives_per_step, r.collective_bytes_per_step, r.peak_bytes,
                    r.step_peak_bytes, r.pipeline_bubble, r.activation_peak_bytes, r.activation_peak_pairs});
  }
  return rows;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report",
                                     "Write a training run's report, one self-contained HTML page: meshtrain report "
                                     "RUN_DIR [-o FILE] (RUN_DIR: the folder of metrics.file)");
  cmd->footer(kReportFooter);
  cmd->add_option("run_dir", args->dir, "The run's folder: where its metrics file and run.json are")
      ->required()
      ->type_name("RUN_DIR");
  cmd->add_option("-o,--out", args->out, "The page to write (default RUN_DIR/report.html)")->type_name("FILE");
  return {cmd, [args] { return run_report(*args); }};
}

TrainReport::TrainReport(const train::Trainer& trainer) : trainer_(trainer) {
  const config::TrainConfig& c = trainer.config();
  if (c.metrics.file.empty() || trainer.rank() != 0) return;
  const fs::path metrics(c.metrics.file);
  const std::string name = metrics.filename().string();
  MT_CHECK(name != report::kRunRecordName && name != report::kReportName,
           "metrics.file {}: {} is the name of a file meshtrain train writes beside the metrics; choose another",
           c.metrics.file, name);
  dir_ = metrics.parent_path().empty() ? "." : metrics.parent_path().string();
  record_path_ = (fs::path(dir_) / report::kRunRecordName).string();
  report_path_ = (fs::path(dir_) / report::kReportName).string();
  for (const std::string& path : {record_path_, report_path_}) {
    const std::string what = fmt::format("{} (beside metrics.file)", fs::path(path).filename().string());
    train::check_output_path(c, path, what);
    check_output_file(path, what);
  }
  record_.metrics_file = name;
  record_.config_toml = config::config_toml(c);
  record_.model = model_line(trainer);
  record_.world_size = trainer.num_ranks();
  record_.layout = trainer.layout_summary();
  record_.pipeline = trainer.pipeline() != nullptr;
  record_.hardware = c.hardware_profile();
  record_.estimate_mode = c.schedule.estimate == config::EstimateMode::benchmark ? "kernels timed here" : "roofline";
  record_.estimated_step_ms = trainer.estimated_step_ms();
  record_.no_estimate_because = trainer.no_estimate_because();
}

void TrainReport::started(const std::vector<train::RankReport>& ranks) {
  if (!active()) return;
  record_.status = "started, not ended: running, or stopped without a word (killed)";
  record_.ranks = rank_rows(trainer_, ranks);
  record_.ranks_when = "as the run started (before any step)";
  write_file_atomically(record_path_, report::run_record_json(record_));
}

std::string TrainReport::ended(const std::string& status, const train::Trainer::Summary* summary,
                               const std::vector<train::RankReport>& ranks) {
  if (!active()) return "";
  record_.status = status;
  if (!ranks.empty()) {
    record_.ranks = rank_rows(trainer_, ranks);
    record_.ranks_when = "as the run ended";
  }
  if (summary != nullptr) {
    record_.median_step_ms = summary->steps_run > 0 ? summary->median_step_ms : 0;
    record_.steps_run = summary->steps_run;
  }
  write_file_atomically(record_path_, report::run_record_json(record_));
  write_file_atomically(report_path_, report::render_report(report::load_run(dir_)));
  return report_path_;
}

void TrainReport::failed(const std::string& error) noexcept {
  try {
    ended("failed: " + error, nullptr, {});
  } catch (const std::exception&) {
  }
}

}  // namespace meshtrain::cli
