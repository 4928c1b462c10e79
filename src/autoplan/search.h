// `meshtrain autoplan`'s search: every layout of a config on N ranks
// (plan_space.h) costed by the step estimate (estimate/estimate.h) on the
// host's cores, each layout from its fastest memory option that fits down
// its memory ladder, then one communication option at a time while that
// helps; branch and bound: a plan whose lower bound (its compute, as the
// analytic bound or a costed sibling's compute says) is no better than the
// K-th best step found is not costed, nor one whose step, extrapolated
// from estimates of the model with fewer layers, is no better.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autoplan/plan_space.h"
#include "estimate/estimate.h"

namespace meshtrain::autoplan {

struct SearchOptions {
  int top = 10;            // the plans to keep costing against (the K of the bound)
  double budget_gib = 0;   // a rank's memory at most this (0: the device's; neither: no check)
  double max_seconds = 0;  // stop costing after this long (0: no limit)
  int threads = 0;         // estimates at once (0: the host's cores)
  // Screen plans by their step extrapolated from two estimates of the
  // model with fewer layers (screen_layers): one no faster than the K-th
  // best step by kScreenMargin is dropped without its full estimate.
  bool screen = true;
  // Screen nothing, but record each costed plan's screen (CostedPlan::
  // screen_step_us): for checking the screen against the full estimates.
  bool check_screen = false;
  SpaceOptions space;
  // Called now and then from the searching threads, one at a time.
  std::function<void(const std::string& line)> progress;
};

// The screen's two layer counts for `planned` (its own layer count less
// repeated layers, so that each pipeline stage keeps its share of the
// remainder), or nothing when the screen would not be cheaper.
std::optional<std::pair<int64_t, int64_t>> screen_layers(const config::TrainConfig& planned);
// The step a screen estimates may be this much below the full estimate.
inline constexpr double kScreenMargin = 0.02;

// A plan costed by the estimate.
struct CostedPlan {
  Plan plan;
  std::vector<std::pair<std::string, std::string>> overrides;  // against the user's config
  double step_us = 0, compute_us = 0, exposed_us = 0, bubble_us = 0;
  double tokens_per_s_per_device = 0, mfu = 0;
  double peak_bytes = 0;  // with a pipeline, its fullest rank's
  bool fits = true;
  double estimate_seconds = 0;  // how long its estimate took
  double screen_step_us = 0;    // with SearchOptions::check_screen: its screen's step (0: it has none)
  std::string bound;            // what bounds it: compute, exposed communication, bubble (and memory when nearly full)
};

// A plan not costed: its reason (a check it fails, a bound, or the
// ladder's step above it fitting).
struct DroppedPlan {
  Plan plan;
  std::vector<std::pair<std::string, std::string>> overrides;  // empty when the plan cannot be applied
  std::string reason;
};

struct SearchResult {
  std::vector<CostedPlan> costed;  // every plan costed, fastest first (those that do not fit last)
  std::vector<DroppedPlan> dropped;
  size_t layouts = 0, layouts_searched = 0;
  double memory_limit_bytes = 0;  // 0: none
  bool complete = true;           // false: stopped by max_seconds
  double seconds = 0;
  // The fitting plans, fastest first, at most `top`.
  std::vector<const CostedPlan*> best(int top) const;
};

// The search for `base` (the user's config) on `world_size` ranks. Throws
// (InvalidArgument) when no plan is legal, or none fits, saying what blocks
// every plan.
SearchResult search_plans(const config::TrainConfig& base, int world_size, const sched::HardwareProfile& hardware,
                          const SearchOptions& options);

}  // namespace meshtrain::autoplan
