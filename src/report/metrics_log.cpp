#include "report/metrics_log.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::report {

namespace {

// The number at `key` into `out`: absent or null leaves NaN; anything else but a number is refused.
void number(const nlohmann::json& j, const char* key, double& out, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  MT_CHECK(it->is_number(), "{}: \"{}\" is {}, not a number", where, key, it->dump());
  out = it->get<double>();
}

MetricsPoint parse_point(const nlohmann::json& j, const std::string& where) {
  MT_CHECK(j.is_object(), "{}: not a JSON object but {}", where, j.dump().substr(0, 80));
  const auto step = j.find("step");
  MT_CHECK(step != j.end() && step->is_number_integer() && step->get<int64_t>() >= 0,
           "{}: no \"step\" (an integer, 0 or more); is this a meshtrain metrics file (metrics.file)?", where);
  MT_CHECK(j.contains("loss") || j.contains("val_loss"),
           "{}: no \"loss\" nor \"val_loss\"; is this a meshtrain metrics file (metrics.file)?", where);
  MetricsPoint p;
  p.step = step->get<int64_t>();
  number(j, "loss", p.loss, where);
  number(j, "val_loss", p.val_loss, where);
  number(j, "lr", p.lr, where);
  number(j, "grad_norm", p.grad_norm, where);
  number(j, "step_ms", p.step_ms, where);
  number(j, "estimated_step_ms", p.estimated_step_ms, where);
  number(j, "tokens_per_s", p.tokens_per_s, where);
  number(j, "peak_bytes", p.peak_bytes, where);
  number(j, "step_peak_bytes", p.step_peak_bytes, where);
  number(j, "peak_bytes_max", p.peak_bytes_max, where);
  return p;
}

// Adds `p`, first dropping the points it logs again (step p.step and later).
// A validation-only line (`validation_only`: no "loss") of the last point's
// step adds its val_loss to that point.
void add(MetricsLog& log, const MetricsPoint& p, bool validation_only) {
  if (validation_only && !log.points.empty() && log.points.back().step == p.step) {
    log.points.back().val_loss = p.val_loss;
    return;
  }
  while (!log.points.empty() && log.points.back().step >= p.step) {
    log.points.pop_back();
    ++log.rerun_steps;
  }
  log.points.push_back(p);
}

}  // namespace

MetricsLog parse_metrics_log(std::string_view text, const std::string& file) {
  MetricsLog log;
  size_t begin = 0;
  for (int64_t number = 1; begin < text.size(); ++number) {
    const size_t newline = text.find('\n', begin);
    const bool last_unterminated = newline == std::string_view::npos;
    const std::string_view line = text.substr(begin, last_unterminated ? std::string_view::npos : newline - begin);
    begin = last_unterminated ? text.size() : newline + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{} line {}", file, number);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && last_unterminated) {
      log.warnings.push_back(
          fmt::format("{}: the last line is cut off (the run stopped while writing it?); left out", where));
      break;
    }
    MT_CHECK(!j.is_discarded(), "{}: not JSON: '{}'; a metrics file holds one JSON object a line", where,
             line.substr(0, 80));
    add(log, parse_point(j, where), !j.contains("loss"));
  }
  return log;
}

MetricsLog read_metrics_log(const std::string& path) {
  return parse_metrics_log(read_small_file(path, size_t{1} << 30, "metrics file"), path);
}

}  // namespace meshtrain::report
