// A run's metrics file read back for its report: one JSON object a line, as
// train::Trainer::run writes them at logged steps. A line cut off at the end
// (a run killed while writing it) is left out with a warning; any other line
// that is not such an object is refused naming the file and line.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::report {

// One logged step. A figure the line does not hold, or holds as null (JSON's
// NaN), is NaN.
struct MetricsPoint {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  int64_t step = 0;
  double loss = kNone, val_loss = kNone, lr = kNone, grad_norm = kNone;
  double step_ms = kNone, estimated_step_ms = kNone, tokens_per_s = kNone;
  double peak_bytes = kNone, step_peak_bytes = kNone, peak_bytes_max = kNone;
};

struct MetricsLog {
  std::vector<MetricsPoint> points;  // in step order
  std::vector<std::string> warnings;
  int64_t rerun_steps = 0;  // logged steps replaced by a later line of the same step (a resumed run)
};

// The lines of `text`, the contents of `file`. Each needs "step" and "loss"
// or "val_loss" (a line of validation alone, merged into the line before when
// that is of its step). A step logged again (a run resumed from a checkpoint
// logs the steps after it again) replaces the earlier lines from that step on.
MetricsLog parse_metrics_log(std::string_view text, const std::string& file);
// The same for the file at `path` (at most 1 GiB).
MetricsLog read_metrics_log(const std::string& path);

}  // namespace meshtrain::report
