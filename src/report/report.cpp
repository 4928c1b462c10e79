#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "core/file_io.h"
#include "report/chart.h"

namespace meshtrain::report {

namespace fs = std::filesystem;

Run load_run(const std::string& dir) {
  std::error_code ec;
  MT_CHECK(fs::is_directory(dir, ec), "{} is not a folder; give the folder of a run's metrics file (metrics.file)",
           dir);
  Run run;
  run.dir = dir;
  run.record_path = (fs::path(dir) / kRunRecordName).string();
  std::string metrics_name = kDefaultMetricsName;
  if (fs::exists(run.record_path, ec)) {
    run.record = parse_run_record(read_small_file(run.record_path, 64 << 20, "run record"), run.record_path);
    metrics_name = run.record->metrics_file;
    MT_CHECK(!metrics_name.empty() && fs::path(metrics_name).filename() == metrics_name,
             "{}: \"metrics_file\" is '{}', not the name of a file in its folder", run.record_path, metrics_name);
  }
  run.metrics_path = (fs::path(dir) / metrics_name).string();
  MT_CHECK(fs::exists(run.metrics_path, ec) || !run.record, "{}: the metrics file it names, {}, is missing",
           run.record_path, run.metrics_path);
  MT_CHECK(fs::exists(run.metrics_path, ec),
           "{} holds neither {} nor {}: meshtrain train writes both beside the metrics file when metrics.file is set",
           dir, kRunRecordName, kDefaultMetricsName);
  run.metrics = read_metrics_log(run.metrics_path);
  if (!run.record)
    run.metrics.warnings.push_back(
        fmt::format("{} is missing: the report shows the metrics only (no config, layout, rank tables or estimate)",
                    run.record_path));
  return run;
}

namespace {

double mib(double bytes) { return bytes / (1 << 20); }

// The points of one metric over the steps (NaN where a line lacks it).
std::vector<Point> series_of(const MetricsLog& log, const std::function<double(const MetricsPoint&)>& value,
                             double scale = 1) {
  std::vector<Point> out;
  for (const MetricsPoint& p : log.points) out.push_back({static_cast<double>(p.step), value(p) * scale});
  return out;
}

bool any_finite(const std::vector<Point>& points) {
  return std::any_of(points.begin(), points.end(), [](const Point& p) { return std::isfinite(p.y); });
}

// The last point of `points` with a finite value, if any.
const Point* last_finite(const std::vector<Point>& points) {
  const auto it = std::find_if(points.rbegin(), points.rend(), [](const Point& p) { return std::isfinite(p.y); });
  return it == points.rend() ? nullptr : &*it;
}

std::vector<Chart> charts(const MetricsLog& log) {
  using P = const MetricsPoint&;
  Chart loss{"Loss", "loss", {{"training", series_of(log, [](P p) { return p.loss; })}}};
  if (std::vector<Point> val = series_of(log, [](P p) { return p.val_loss; }); any_finite(val)) {
    std::erase_if(val, [](const Point& p) { return !std::isfinite(p.y); });  // only some steps validate
    loss.series.push_back({"validation", std::move(val), /*markers=*/true});
  }
  Chart memory{"Peak memory",
               "MiB",
               {{"rank 0, so far", series_of(
                                       log, [](P p) { return p.peak_bytes; }, 1.0 / (1 << 20))},
                {"rank 0, in the step", series_of(
                                            log, [](P p) { return p.step_peak_bytes; }, 1.0 / (1 << 20))}}};
  if (std::vector<Point> max = series_of(
          log, [](P p) { return p.peak_bytes_max; }, 1.0 / (1 << 20));
      any_finite(max))
    memory.series.push_back({"largest rank, so far", std::move(max), false, /*dashed=*/true});
  memory.y_from_zero = true;
  Chart time{"Step time", "ms", {{"measured", series_of(log, [](P p) { return p.step_ms; })}}};
  if (std::vector<Point> est = series_of(log, [](P p) { return p.estimated_step_ms > 0 ? p.estimated_step_ms : NAN; });
      any_finite(est))
    time.series.push_back({"estimate", std::move(est), false, /*dashed=*/true});
  time.y_from_zero = true;
  return {std::move(loss),
          {"Learning rate", "lr", {{"lr", series_of(log, [](P p) { return p.lr; })}}},
          {"Gradient norm", "norm", {{"before clipping", series_of(log, [](P p) { return p.grad_norm; })}}},
          {"Throughput", "tokens/s", {{"the job", series_of(log, [](P p) { return p.tokens_per_s; })}}, true},
          std::move(memory),
          std::move(time)};
}

// The measured step time: the run's median of the steps after the first when
// it finished, else the median of the logged steps after the first logged.
std::string measured_step(const Run& run) {
  if (run.record && run.record->median_step_ms > 0)
    return fmt::format("{:.1f} ms (the median of the run's steps after the first)", run.record->median_step_ms);
  std::vector<double> ms;
  for (size_t i = run.metrics.points.size() > 1 ? 1 : 0; i < run.metrics.points.size(); ++i)
    if (std::isfinite(run.metrics.points[i].step_ms)) ms.push_back(run.metrics.points[i].step_ms);
  if (ms.empty()) return "none logged";
  std::sort(ms.begin(), ms.end());
  return fmt::format("{:.1f} ms (the median of the logged steps{})", ms[(ms.size() - 1) / 2],
                     run.metrics.points.size() > 1 ? " after the first" : "");
}

std::string estimate_row(const Run& run) {
  const std::string measured = measured_step(run);
  if (!run.record) return fmt::format("measured {}; no run.json, so no estimate", measured);
  const RunRecord& r = *run.record;
  if (r.estimated_step_ms <= 0)
    return fmt::format("no estimate on {}: {}; measured {}", r.hardware, r.no_estimate_because, measured);
  return fmt::format("estimate {:.1f} ms on {} ({}); measured {}", r.estimated_step_ms, r.hardware, r.estimate_mode,
                     measured);
}

void row(std::string& out, std::string_view name, const std::string& value) {
  out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", escape_html(name), escape_html(value));
}

std::string summary(const Run& run) {
  const MetricsLog& log = run.metrics;
  std::string out = "<table class=\"summary\">\n";
  if (run.record) row(out, "Status", run.record->status);
  if (run.record && !run.record->model.empty()) row(out, "Model", run.record->model);
  if (log.points.empty()) {
    row(out, "Steps logged", "none yet");
  } else {
    row(out, "Steps logged",
        fmt::format("{}, from step {} to {}{}", log.points.size(), log.points.front().step, log.points.back().step,
                    log.rerun_steps > 0
                        ? fmt::format(" ({} earlier lines replaced: steps run again after a resume)", log.rerun_steps)
                        : ""));
  }
  const std::vector<Point> loss = series_of(log, [](const MetricsPoint& p) { return p.loss; });
  const std::vector<Point> val = series_of(log, [](const MetricsPoint& p) { return p.val_loss; });
  if (const Point* p = last_finite(loss); p != nullptr && &loss.back() == p)
    row(out, "Final training loss", fmt::format("{:.4f} at step {:.0f}", p->y, p->x));
  else if (!loss.empty())
    row(out, "Final training loss",
        fmt::format("{} at step {:.0f} (the last finite: {})", loss.back().y, loss.back().x,
                    p ? fmt::format("{:.4f} at step {:.0f}", p->y, p->x) : "none"));
  if (const Point* p = last_finite(val))
    row(out, "Final validation loss", fmt::format("{:.4f} at step {:.0f}", p->y, p->x));
  if (!log.points.empty()) {
    const MetricsPoint& last = log.points.back();
    row(out, "Throughput", fmt::format("{} tokens/s at step {}", format_number(last.tokens_per_s), last.step));
    const double peak = std::isfinite(last.peak_bytes_max) ? last.peak_bytes_max : last.peak_bytes;
    row(out, "Peak memory",
        fmt::format("{:.1f} MiB{}", mib(peak), std::isfinite(last.peak_bytes_max) ? " on the largest rank" : ""));
  }
  row(out, "Step time", estimate_row(run));
  return out + "</table>\n";
}

std::string rank_table(const RunRecord& r) {
  std::string out = fmt::format(
      "<p>Each rank's figures, as taken {}: what it holds, the collectives of one step and the bytes they move, "
      "its peak memory so far and in its last step.</p>\n<table class=\"ranks\">\n<tr>",
      escape_html(r.ranks_when.empty() ? "by the run" : r.ranks_when));
  const char* heads[] = {"rank",
                         "coordinate",
                         "parameters (MiB)",
                         "gradients (MiB)",
                         "optimizer states (MiB)",
                         "collectives / step",
                         "moved / step (MiB)",
                         "peak (MiB)",
                         "step peak (MiB)"};
  for (const char* h : heads) out += fmt::format("<th>{}</th>", h);
  if (r.pipeline) out += "<th>bubble</th><th>activations (MiB)</th><th>(stage, microbatch) pairs</th>";
  out += "</tr>\n";
  for (const RankRow& k : r.ranks) {
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.0f}</td><td>{:.2f}</td>"
        "<td>{:.1f}</td><td>{:.1f}</td>",
        k.rank, escape_html(k.coordinate.empty() ? "-" : k.coordinate), mib(k.parameter_bytes), mib(k.gradient_bytes),
        mib(k.optimizer_state_bytes), k.collectives_per_step, mib(k.collective_bytes_per_step), mib(k.peak_bytes),
        mib(k.step_peak_bytes));
    if (r.pipeline)
      out += fmt::format("<td>{:.1f}%</td><td>{:.2f}</td><td>{:.0f}</td>", 100 * k.pipeline_bubble,
                         mib(k.activation_peak_bytes), k.activation_peak_pairs);
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.5em}
table{border-collapse:collapse;margin:0.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
table.ranks td{text-align:right}.charts{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;border:1px solid #ddd;padding:4px;flex:1 1 480px;max-width:600px}figcaption{font-weight:bold;padding:2px 4px}
svg{font-size:11px;font-family:sans-serif;width:100%;height:auto}svg polyline{fill:none;stroke-width:1.5}
svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#999}
pre{background:#f6f6f6;padding:8px;overflow:auto}.notes{background:#fff6d6;padding:4px 12px}
)";

}  // namespace

std::string render_report(const Run& run) {
  const std::string name = fs::path(run.dir).lexically_normal().filename().string();
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>meshtrain run report: {0}</title>"
      "\n<style>\n{1}</style>\n</head>\n<body>\n<h1>meshtrain run report: {0}</h1>\n",
      escape_html(name.empty() ? run.dir : name), kStyle);
  out += summary(run);
  if (!run.metrics.warnings.empty()) {
    out += "<div class=\"notes\"><ul>\n";
    for (const std::string& w : run.metrics.warnings) out += fmt::format("<li>{}</li>\n", escape_html(w));
    out += "</ul></div>\n";
  }
  out += "<h2>Metrics per step</h2>\n<div class=\"charts\">\n";
  for (const Chart& c : charts(run.metrics))
    out += fmt::format("<figure>\n<figcaption>{}</figcaption>\n{}</figure>\n", escape_html(c.title), render_svg(c));
  out += fmt::format(
      "</div>\n<p>A series of more than {} points is drawn from each of {} buckets of consecutive steps' lowest and "
      "highest values.</p>\n",
      kMaxChartPoints, (kMaxChartPoints - 2) / 2);
  if (run.record) {
    const RunRecord& r = *run.record;
    out += fmt::format("<h2>Layout</h2>\n<p>{} rank{}.</p>\n", r.world_size, r.world_size > 1 ? "s" : "");
    if (!r.layout.empty()) out += fmt::format("<pre>{}</pre>\n", escape_html(r.layout));
    out += "<h2>Ranks</h2>\n" + rank_table(r);
    out += fmt::format("<h2>Config</h2>\n<pre>{}</pre>\n", escape_html(r.config_toml));
  }
  out += fmt::format("<p>Written by meshtrain report from {}{}.</p>\n</body>\n</html>\n",
                     escape_html(run.record ? fs::path(run.record_path).filename().string() + " and " : ""),
                     escape_html(fs::path(run.metrics_path).filename().string()));
  return out;
}

}  // namespace meshtrain::report
