// The run report (report/): reading a metrics file (a cut-off last line is
// left out with a warning; garbage and missing fields are refused naming the
// line; a resumed run's repeated steps replace the earlier lines), run.json
// round trips, decimation keeps the envelope and the last point, escaping,
// and a 10,000-step run's page stays under 2 MB.
#include "report/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "report/chart.h"
#include "report/metrics_log.h"
#include "report/run_record.h"

using namespace meshtrain;
using namespace meshtrain::report;

namespace {

std::string line(int64_t step, double loss, const std::string& extra = "") {
  return fmt::format(
             R"({{"step":{},"loss":{},"lr":0.001,"grad_norm":1.5,"step_ms":20.5,"tokens_per_s":50000,"peak_bytes":1048576,)"
             R"("step_peak_bytes":524288,"gflops_per_s":3,"estimated_step_ms":12.5,"skipped_steps":0{}}})",
             step, loss, extra) +
         "\n";
}

// The message of the InvalidArgument `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("meshtrain_report_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST(ReportMetrics, ReadsLinesWithAndWithoutValidation) {
  const MetricsLog log =
      parse_metrics_log(line(1, 5.5) + line(2, 5.0, R"(,"val_loss":5.25)") + line(3, 4.5), "m.jsonl");
  ASSERT_EQ(log.points.size(), 3u);
  EXPECT_EQ(log.points[2].step, 3);
  EXPECT_DOUBLE_EQ(log.points[2].loss, 4.5);
  EXPECT_DOUBLE_EQ(log.points[1].val_loss, 5.25);
  EXPECT_TRUE(std::isnan(log.points[0].val_loss));
  EXPECT_TRUE(std::isnan(log.points[0].peak_bytes_max));  // one rank: none
  EXPECT_DOUBLE_EQ(log.points[0].estimated_step_ms, 12.5);
  EXPECT_TRUE(log.warnings.empty());
}

TEST(ReportMetrics, CutOffLastLineIsLeftOutWithAWarning) {
  const std::string whole = line(1, 5.5) + line(2, 5.0);
  const MetricsLog log = parse_metrics_log(whole + line(3, 4.5).substr(0, 30), "m.jsonl");
  ASSERT_EQ(log.points.size(), 2u);
  ASSERT_EQ(log.warnings.size(), 1u);
  EXPECT_NE(log.warnings[0].find("m.jsonl line 3: the last line is cut off"), std::string::npos) << log.warnings[0];
  // A whole last line without its newline is read.
  EXPECT_EQ(parse_metrics_log(whole + line(3, 4.5).substr(0, line(3, 4.5).size() - 1), "m").points.size(), 3u);
}

TEST(ReportMetrics, GarbageAndMissingFieldsAreRefusedNamingTheLine) {
  EXPECT_NE(error_of([] {
              parse_metrics_log(line(1, 5) + "not json\n" + line(2, 4), "m.jsonl");
            }).find("m.jsonl line 2: not JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_metrics_log(line(1, 5) + "{\"loss\": 3}\n", "m.jsonl");
            }).find("m.jsonl line 2: no \"step\""),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_metrics_log("{\"step\": 1}\n", "m.jsonl"); }).find("m.jsonl line 1: no \"loss\""),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_metrics_log("{\"step\": -1, \"loss\": 2}\n", "m.jsonl"); }).find("no \"step\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_metrics_log(R"({"step": 1, "loss": 2, "lr": "high"})", "m.jsonl");
            }).find("\"lr\" is \"high\", not a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_metrics_log("[1, 2]\n", "m.jsonl"); }).find("line 1: not a JSON object"),
            std::string::npos);
  // Garbage on a last line with its newline is no cut-off line.
  EXPECT_NE(error_of([] { parse_metrics_log(line(1, 5) + "{\"step\n", "m.jsonl"); }).find("line 2: not JSON"),
            std::string::npos);
}

TEST(ReportMetrics, NullLossIsNanAndRepeatedStepsReplaceTheEarlier) {
  // Steps 1..3, then a resume from step 1's checkpoint logs 2 and 3 again.
  const MetricsLog log = parse_metrics_log(line(1, 5) + line(2, 4) +
                                               R"({"step":3,"loss":null})"
                                               "\n" +
                                               line(2, 4.25) + line(3, 4.125),
                                           "m");
  ASSERT_EQ(log.points.size(), 3u);
  EXPECT_EQ(log.rerun_steps, 2);
  EXPECT_DOUBLE_EQ(log.points[1].loss, 4.25);
  EXPECT_DOUBLE_EQ(log.points[2].loss, 4.125);
  EXPECT_TRUE(std::isnan(parse_metrics_log(R"({"step":3,"loss":null})", "m").points[0].loss));
}

TEST(ReportMetrics, ValidationOnlyLinesJoinTheirStep) {
  // Validation before training (step 0), and on a line of its own after step 2's.
  const MetricsLog log = parse_metrics_log(R"({"step":0,"val_loss":6})"
                                           "\n" +
                                               line(1, 5) + line(2, 4) +
                                               R"({"step":2,"val_loss":4.5})"
                                               "\n",
                                           "m");
  ASSERT_EQ(log.points.size(), 3u);
  EXPECT_EQ(log.rerun_steps, 0);
  EXPECT_TRUE(std::isnan(log.points[0].loss));
  EXPECT_DOUBLE_EQ(log.points[0].val_loss, 6);
  EXPECT_DOUBLE_EQ(log.points[2].loss, 4);
  EXPECT_DOUBLE_EQ(log.points[2].val_loss, 4.5);
}

TEST(ReportRunRecord, RoundTripsAndRefusesOtherJson) {  // and what the fuzzer found (fuzz/corpus/report/regression_*)
  RunRecord r;
  r.metrics_file = "metrics.jsonl";
  r.config_toml = "[model]\ndim = 64\n";
  r.world_size = 2;
  r.estimated_step_ms = 12.5;
  r.ranks = {{0, "dp_shard 0", 100, 100, 200, 4, 1000, 5000, 4000},
             {1, "dp_shard 1", 100, 100, 200, 4, 1000, 6000, 4000}};
  const RunRecord back = parse_run_record(run_record_json(r), "run.json");
  EXPECT_EQ(back.metrics_file, r.metrics_file);
  EXPECT_EQ(back.config_toml, r.config_toml);
  EXPECT_EQ(back.world_size, 2);
  EXPECT_DOUBLE_EQ(back.estimated_step_ms, 12.5);
  ASSERT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[1].coordinate, "dp_shard 1");
  EXPECT_DOUBLE_EQ(back.ranks[1].peak_bytes, 6000);
  EXPECT_NE(error_of([] { parse_run_record("{\"a\": 1}", "x/run.json"); }).find("x/run.json is not a meshtrain run"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_run_record("{", "x/run.json"); }).find("x/run.json is not JSON"), std::string::npos);
  EXPECT_NE(error_of([] {
              parse_run_record(R"({"format": "meshtrain run record 1", "world_size": "two"})", "run.json");
            }).find("\"world_size\" is \"two\""),
            std::string::npos);
  EXPECT_NE(
      error_of([] { parse_run_record(R"({"format": {"a": 1}})", "run.json"); }).find("not a meshtrain run record"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              parse_run_record(R"({"format": "meshtrain run record 1", "world_size": 1e300})", "r");
            }).find("not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_run_record(R"({"format": "meshtrain run record 1", "model": 1E962310791})", "r");
            }).find("r is not JSON"),
            std::string::npos);
}

TEST(ReportChart, DecimationKeepsEnvelopeFirstAndLast) {
  std::vector<Point> points;
  for (int i = 1; i <= 10000; ++i) points.push_back({double(i), std::sin(i * 0.01) + (i == 5000 ? 10 : 0)});
  const std::vector<Point> kept = decimate(points, 1200);
  EXPECT_LE(kept.size(), 1200u);
  EXPECT_GE(kept.size(), 1000u);
  EXPECT_EQ(kept.front().x, 1);
  EXPECT_EQ(kept.back().x, 10000);
  bool spike = false;
  for (size_t i = 0; i < kept.size(); ++i) {
    spike = spike || kept[i].x == 5000;
    if (i > 0) {
      EXPECT_LT(kept[i - 1].x, kept[i].x);
    }
  }
  EXPECT_TRUE(spike) << "the one outlier is kept";
  EXPECT_EQ(decimate({{1, 1}, {2, 2}}, 1200).size(), 2u);
}

TEST(ReportChart, EscapesTextAndFormatsNumbers) {
  EXPECT_EQ(escape_html("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(format_number(12500), "12.5k");
  EXPECT_EQ(format_number(0.001), "0.001");
  EXPECT_EQ(format_number(2.5e6), "2.5M");
  Chart c{"T<", "y", {{"s&", {{1, 1}, {2, NAN}, {3, 2}, {4, 3}}}}};
  const std::string svg = render_svg(c);
  EXPECT_EQ(svg.find("s&<"), std::string::npos);
  EXPECT_NE(svg.find("s&amp;"), std::string::npos);
  EXPECT_NE(svg.find("aria-label=\"T&lt;\""), std::string::npos);
  size_t lines = 0;  // the NaN splits the series in two
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(render_svg({"Empty", "y", {{"s", {}}}}).find("no values logged"), std::string::npos);
  // Extreme values draw (or say they cannot) without hanging: a range tiny
  // against its magnitude, one that overflows, one flat.
  for (const auto& [a, b] :
       std::vector<std::pair<double, double>>{{1e17, 1e17 + 16}, {-1e308, 1e308}, {5, 5}, {0, 0}}) {
    const std::string extreme = render_svg({"Extreme", "y", {{"s", {{1, a}, {2, b}}}}});
    EXPECT_EQ(extreme.find("nan"), std::string::npos) << a << " " << b;
    EXPECT_LT(extreme.size(), 10000u) << a << " " << b;
  }
}

TEST(ReportPage, TenThousandStepsStayUnderTwoMegabytes) {
  const std::string dir = scratch_dir("10k");
  std::string metrics;
  for (int s = 1; s <= 10000; ++s)
    metrics += line(s, 8.0 * std::exp(-s / 2000.0) + 0.01 * std::sin(s), s % 250 == 0 ? R"(,"val_loss":3.5)" : "");
  write(dir + "/metrics.jsonl", metrics);
  RunRecord r;
  r.metrics_file = "metrics.jsonl";
  r.config_toml = "[data]\npath = \"<&data>.txt\"\n";
  r.ranks = {{0, "", 1, 2, 3, 4, 5, 6, 7}};
  write(dir + "/run.json", run_record_json(r));
  const std::string html = render_report(load_run(dir));
  EXPECT_LT(html.size(), 2u << 20) << html.size() << " bytes";
  EXPECT_NE(html.find(fmt::format("{:.4f} at step 10000", 8.0 * std::exp(-5.0) + 0.01 * std::sin(10000))),
            std::string::npos);
  EXPECT_NE(html.find("3.5000 at step 10000"), std::string::npos);  // the final validation loss
  EXPECT_NE(html.find("path = &quot;&lt;&amp;data&gt;.txt&quot;"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  for (const char* title : {"Loss", "Learning rate", "Gradient norm", "Throughput", "Peak memory", "Step time"})
    EXPECT_NE(html.find(fmt::format("<figcaption>{}</figcaption>", title)), std::string::npos) << title;
  std::filesystem::remove_all(dir);
}

TEST(ReportPage, MissingFilesAreNamed) {
  const std::string dir = scratch_dir("missing");
  EXPECT_NE(error_of([&] { load_run(dir + "/nothing"); }).find("is not a folder"), std::string::npos);
  EXPECT_NE(error_of([&] { load_run(dir); }).find("holds neither run.json nor metrics.jsonl"), std::string::npos);
  RunRecord r;
  r.metrics_file = "m.jsonl";
  write(dir + "/run.json", run_record_json(r));
  EXPECT_NE(error_of([&] { load_run(dir); }).find("the metrics file it names"), std::string::npos);
  r.metrics_file = "../m.jsonl";
  write(dir + "/run.json", run_record_json(r));
  EXPECT_NE(error_of([&] { load_run(dir); }).find("not the name of a file in its folder"), std::string::npos);
  // Without run.json, metrics.jsonl alone makes a page, with a note.
  std::filesystem::remove(dir + "/run.json");
  write(dir + "/metrics.jsonl", line(1, 5));
  const report::Run run = load_run(dir);
  EXPECT_FALSE(run.record);
  EXPECT_EQ(run.metrics.warnings.size(), 1u);
  EXPECT_NE(render_report(run).find("5.0000 at step 1"), std::string::npos);
  std::filesystem::remove_all(dir);
}
