#include "autoplan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace meshtrain::autoplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double gib(double bytes) { return bytes / (1ull << 30); }

// "12.3 GiB", or "45.6 MiB" below a GiB.
std::string amount(double bytes) {
  return bytes >= (1ull << 30) ? fmt::format("{:.1f} GiB", gib(bytes)) : fmt::format("{:.1f} MiB", bytes / (1 << 20));
}

std::string describe_us(double us) {
  return us >= 1e6 ? fmt::format("{:.3f} s", us * 1e-6) : fmt::format("{:.2f} ms", us * 1e-3);
}

// What bounds a costed plan: the largest of its compute, its exposed
// communication and its pipeline bubble, as a share of the step.
std::string bounding(const CostedPlan& c, double limit_bytes) {
  const double communication = std::max(0.0, c.exposed_us - c.bubble_us);
  std::string what = "compute";
  double most = c.compute_us;
  if (communication > most) what = "exposed communication", most = communication;
  if (c.bubble_us > most) what = "bubble", most = c.bubble_us;
  std::string out = fmt::format("{} ({:.0f}% of the step)", what, 100 * most / c.step_us);
  if (limit_bytes > 0 && c.peak_bytes >= 0.9 * limit_bytes) out += "; memory (over 90% used)";
  return out;
}

// The step of `planned` with n_layers l, or nothing when that does not estimate.
std::optional<double> step_with_layers(const config::TrainConfig& planned, int world_size,
                                       const sched::HardwareProfile& hardware, int64_t layers) {
  config::TrainConfig fewer = planned;
  fewer.model.n_layers = layers;
  try {
    return estimate::estimate_training(fewer, world_size, 0, hardware).time.step_us;
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

class Search {
 public:
  Search(const config::TrainConfig& base, int world_size, const sched::HardwareProfile& hardware,
         const SearchOptions& options)
      : base_(base), world_(world_size), hardware_(hardware), options_(options) {
    const double limit_gib = options.budget_gib > 0 ? options.budget_gib : hardware.memory_gib;
    result_.memory_limit_bytes = limit_gib > 0 ? limit_gib * (1ull << 30) : 0;
  }

  SearchResult run() {
    const auto started = started_;
    std::vector<RejectedPlan> rejected;
    std::vector<Plan> layouts = enumerate_layouts(base_, world_, options_.space, rejected);
    for (const RejectedPlan& r : rejected) result_.dropped.push_back({r.plan, {}, r.reason});
    rejected_ = rejected.size();
    if (layouts.empty()) throw InvalidArgument(no_legal_plan(rejected));
    // The layouts by their bound, the most promising first.
    std::vector<std::pair<double, Plan>> ordered;
    for (const Plan& p : layouts)
      ordered.emplace_back(lower_bounds(apply_plan(base_, p, world_), world_, hardware_).step_us, p);
    std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    result_.layouts = ordered.size();

    const int threads =
        options_.threads > 0 ? options_.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&] {
        for (size_t i; (i = next_.fetch_add(1)) < ordered.size();) {
          if (out_of_time()) break;
          search_layout(ordered[i].second);
          std::lock_guard lock(mu_);
          ++searched_;
          done_.notify_one();
        }
      });
    report_progress(started, ordered.size());
    for (auto& w : workers) w.join();

    result_.layouts_searched = searched_;
    result_.complete = !stopped_ && searched_ == ordered.size();
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::stable_sort(result_.costed.begin(), result_.costed.end(), [](const CostedPlan& a, const CostedPlan& b) {
      return a.fits != b.fits ? a.fits : a.step_us < b.step_us;
    });
    if (result_.costed.empty() || !result_.costed.front().fits) throw InvalidArgument(nothing_fits());
    return std::move(result_);
  }

 private:
  bool out_of_time() {
    if (options_.max_seconds <= 0) return false;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() < options_.max_seconds)
      return false;
    std::lock_guard lock(mu_);
    stopped_ = true;
    done_.notify_one();
    return true;
  }

  void report_progress(std::chrono::steady_clock::time_point started, size_t total) {
    std::unique_lock lock(mu_);
    const auto finished = [&] { return searched_ >= total || stopped_; };
    while (!finished()) {
      if (done_.wait_for(lock, std::chrono::seconds(2), finished) || !options_.progress) continue;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      options_.progress(fmt::format(
          "autoplan: {} of {} layouts searched, {} plans costed, best {} ({:.0f} s)", searched_, total,
          result_.costed.size(),
          best_steps_.empty() ? std::string("none yet") : describe_us(best_steps_.front()) + " a step", seconds));
    }
  }

  double kth_best() {
    std::lock_guard lock(mu_);
    return static_cast<int>(best_steps_.size()) < options_.top ? kInf : best_steps_[options_.top - 1];
  }

  void drop(const Plan& p, const config::TrainConfig* planned, const std::string& reason) {
    std::lock_guard lock(mu_);
    result_.dropped.push_back(
        {p, planned ? plan_overrides(base_, *planned) : decltype(DroppedPlan::overrides){}, reason});
  }

  // The plan costed, unless it cannot run or `bound_us` (a lower bound of
  // its step) is no better than the K-th best step found.
  std::optional<CostedPlan> cost(const Plan& p, double bound_us) {
    if (out_of_time()) return std::nullopt;  // the layout's search ends with the time given
    config::TrainConfig planned;
    try {
      planned = apply_plan(base_, p, world_);
    } catch (const InvalidArgument& e) {
      drop(p, nullptr, e.what());
      return std::nullopt;
    }
    const Bounds bounds = lower_bounds(planned, world_, hardware_);
    const double bound = std::max(bound_us, bounds.step_us), kth = kth_best();
    if (bound >= kth) {
      const char* what = bound > bound_us && bounds.communication_us > 0
                             ? (planned.parallel.pp > 1 ? "its compute and then its FSDP gathers and reductions take"
                                                        : "its compute or its FSDP gathers or reductions alone take")
                             : "its compute alone takes";
      drop(p, &planned,
           fmt::format("bound: {} at least {}, no faster than the {} best plans' {}", what, describe_us(bound),
                       options_.top, describe_us(kth)));
      return std::nullopt;
    }
    if (result_.memory_limit_bytes > 0 && bounds.memory_bytes > result_.memory_limit_bytes) {
      drop(p, &planned,
           fmt::format("memory: its master weights and optimizer states{} alone take {} of the {}",
                       planned.parallel.pp > 1 && planned.parallel.dp_shard * planned.parallel.cp > 1
                           ? " with a stage's weights gathered"
                           : "",
                       amount(bounds.memory_bytes), amount(result_.memory_limit_bytes)));
      return std::nullopt;
    }
    if (screened_out(p, planned, kth)) return std::nullopt;
    estimate::TrainingEstimate e;
    const auto began = std::chrono::steady_clock::now();
    try {
      e = estimate::estimate_training(planned, world_, 0, hardware_);
    } catch (const InvalidArgument& error) {
      drop(p, &planned, error.what());
      return std::nullopt;
    }
    CostedPlan c;
    c.plan = p;
    c.overrides = plan_overrides(base_, planned);
    c.estimate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    c.step_us = e.time.step_us;
    c.compute_us = e.time.compute_us;
    c.exposed_us = e.time.exposed_us;
    if (e.pipeline) c.bubble_us = e.pipeline->bubble_fraction * e.pipeline->makespan_us * e.pipeline->runs;
    c.tokens_per_s_per_device = e.tokens_per_s_per_device;
    c.mfu = e.mfu;
    // A pipeline's ranks hold different stages: the plan fits when its fullest does.
    c.peak_bytes = std::max(e.memory.peak_bytes, e.pipeline ? e.pipeline->fullest_peak_bytes : 0.0);
    c.fits = result_.memory_limit_bytes <= 0 || c.peak_bytes <= result_.memory_limit_bytes;
    c.bound = bounding(c, result_.memory_limit_bytes);
    if (options_.check_screen)
      if (const std::optional<Screened> screened = screen(planned)) c.screen_step_us = screened->step_us;
    std::lock_guard lock(mu_);
    result_.costed.push_back(c);
    if (c.fits) {
      best_steps_.insert(std::upper_bound(best_steps_.begin(), best_steps_.end(), c.step_us), c.step_us);
      if (static_cast<int>(best_steps_.size()) > options_.top) best_steps_.pop_back();
    }
    return c;
  }

  struct Screened {
    int64_t layers[2];
    double step_us;      // extrapolated to the plan's layers
    bool early = false;  // the first estimate alone: step_us is its step
  };
  // The plan's screen, or nothing when it has none or its estimates fail.
  // Where the estimate with fewer layers already takes `enough` (less the
  // margin), the screen stops there: a step that grows with the layers
  // extrapolates to more.
  std::optional<Screened> screen(const config::TrainConfig& planned, double enough = kInf) const {
    // Automatic bucketing picks its buckets by the step's estimate, which
    // need not pick alike with fewer layers: not screened.
    if (planned.schedule.bucket_mode == sched::BucketMode::automatic) return std::nullopt;
    const auto layers = screen_layers(planned);
    if (!layers) return std::nullopt;
    const auto [l1, l2] = *layers;
    const std::optional<double> t1 = step_with_layers(planned, world_, hardware_, l1);
    if (t1 && *t1 * (1 - kScreenMargin) >= enough) return Screened{{l1, l1}, *t1, true};
    const std::optional<double> t2 = t1 ? step_with_layers(planned, world_, hardware_, l2) : std::nullopt;
    if (!t2) return std::nullopt;
    const double per_layer = (*t2 - *t1) / static_cast<double>(l2 - l1);
    return Screened{{l1, l2}, *t2 + per_layer * static_cast<double>(planned.model.n_layers - l2)};
  }

  // Whether the plan's screen (SearchOptions::screen) says it cannot beat
  // the K-th best step `kth`: then it is dropped, saying so.
  bool screened_out(const Plan& p, const config::TrainConfig& planned, double kth) {
    if (!options_.screen || options_.check_screen || kth == kInf) return false;
    const std::optional<Screened> s = screen(planned, kth);
    if (!s || s->step_us * (1 - kScreenMargin) < kth) return false;
    const std::string step =
        s->early ? fmt::format("its step with {} layers alone is {}", s->layers[0], describe_us(s->step_us))
                 : fmt::format("its step, extrapolated from estimates with {} and {} layers, is {}", s->layers[0],
                               s->layers[1], describe_us(s->step_us));
    drop(p, &planned,
         fmt::format("screen: {}; less {:.0f}%, it is still no faster than the {} best plans' {}", step,
                     100 * kScreenMargin, options_.top, describe_us(kth)));
    return true;
  }

  // One layout: down its memory ladder to the first plan that fits, then
  // each communication option kept where it makes the step faster. Every
  // step of the ladder recomputes or accumulates more, so its compute is at
  // least the last one's; a communication option leaves the compute as it is.
  void search_layout(const Plan& root) {
    std::optional<CostedPlan> current = cost(root, 0);
    if (!current) return;
    double compute_floor = current->compute_us;
    if (!current->fits) {
      std::optional<CostedPlan> found;
      for (const Plan& rung : memory_ladder(base_, root)) {
        if (found) {
          drop(rung, nullptr, "dominated: a plan with less recompute or accumulation fits");
          continue;
        }
        std::optional<CostedPlan> c = cost(rung, compute_floor);
        if (!c) continue;
        compute_floor = std::max(compute_floor, c->compute_us);
        if (c->fits) found = c;
      }
      if (!found) return;
      current = found;
    }
    for (const Plan& variant : communication_variants(base_, current->plan, options_.space)) {
      // Each option computes at least as much as the plan it changes (ring
      // attention too: its blocks and their merges against the whole
      // keys' attention, in every pair costed so far), but for a pipeline
      // keeping its backward's layouts, which casts its weights once.
      const bool casts_once = variant.pp_keep_backward_layouts != current->plan.pp_keep_backward_layouts;
      std::optional<CostedPlan> c = cost(variant, casts_once ? 0 : current->compute_us);
      if (c && c->fits && c->step_us < current->step_us) current = c;
    }
  }

  // The reasons most plans were dropped for, the commonest first.
  static std::string common_reasons(const std::vector<std::string>& reasons) {
    std::map<std::string, int> counts;
    for (const std::string& r : reasons) ++counts[r];
    std::vector<std::pair<int, std::string>> common;
    for (const auto& [reason, n] : counts) common.emplace_back(n, reason);
    std::stable_sort(common.begin(), common.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string out;
    for (size_t i = 0; i < common.size() && i < 4; ++i)
      out += fmt::format("\n  {} of them: {}", common[i].first, common[i].second);
    return out;
  }

  std::string no_legal_plan(const std::vector<RejectedPlan>& rejected) const {
    std::vector<std::string> reasons;
    for (const RejectedPlan& r : rejected) reasons.push_back(r.reason);
    return fmt::format(
        "autoplan: no plan lays the config out on {} ranks; of the {} layouts tried, every one fails a "
        "check{}",
        world_, rejected.size(), common_reasons(reasons));
  }

  std::string nothing_fits() const {
    double least = kInf;
    std::string which;
    for (const CostedPlan& c : result_.costed)
      if (c.peak_bytes < least) least = c.peak_bytes, which = overrides_text(c.overrides);
    if (least < kInf)
      return fmt::format(
          "autoplan: no plan fits in {} a rank: the least memory of the {} plans costed is {} ({}); add ranks, or "
          "raise --budget-gib",
          amount(result_.memory_limit_bytes), result_.costed.size(), amount(least),
          which.empty() ? "the config" : which);
    if (stopped_) return "autoplan: --max-seconds stopped the search before any plan was costed; allow it longer";
    std::vector<std::string> reasons;
    for (size_t i = rejected_; i < result_.dropped.size(); ++i) reasons.push_back(result_.dropped[i].reason);
    return fmt::format("autoplan: no plan of the {} legal layouts could be costed{}", result_.layouts,
                       common_reasons(reasons));
  }

  const config::TrainConfig& base_;
  const int world_;
  const sched::HardwareProfile& hardware_;
  const SearchOptions& options_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::condition_variable done_;
  std::atomic<size_t> next_{0};
  size_t searched_ = 0;             // under mu_
  bool stopped_ = false;            // under mu_
  std::vector<double> best_steps_;  // the fitting plans' steps, fastest first, at most `top`
  size_t rejected_ = 0;             // the first entries of result_.dropped: the layouts that failed a check
  SearchResult result_;
};

}  // namespace

std::optional<std::pair<int64_t, int64_t>> screen_layers(const config::TrainConfig& planned) {
  const models::LlamaConfig& m = planned.model;
  const parallel::ParallelConfig& p = planned.parallel;
  int64_t first = 0, step = 1;  // the screen's first layer count, and what it adds
  if (p.pp == 1) {
    // Layers past the dense ones repeat: 2 and 4 of them.
    first = (m.n_experts > 0 ? m.first_dense_layers : 0) + 2;
    step = 2;
  } else {
    if (!p.pp_layers_per_stage.empty() || !p.pp_schedule_csv.empty() || (m.n_experts > 0 && m.first_dense_layers > 0))
      return std::nullopt;
    // The units (layers, the embedding and the head) over the stages leave
    // the same remainder, so the same stages take one more.
    const int64_t stages = p.pp * p.stages_per_rank(), remainder = (m.n_layers + 2) % stages;
    first = stages + remainder - 2;
    while (first < 1) first += stages;
    step = stages;
  }
  const int64_t second = first + step;
  if (first + second > m.n_layers / 2) return std::nullopt;  // not cheaper enough
  return std::pair{first, second};
}

std::vector<const CostedPlan*> SearchResult::best(int top) const {
  std::vector<const CostedPlan*> out;
  for (const CostedPlan& c : costed)
    if (c.fits && static_cast<int>(out.size()) < top) out.push_back(&c);
  return out;
}

SearchResult search_plans(const config::TrainConfig& base, int world_size, const sched::HardwareProfile& hardware,
                          const SearchOptions& options) {
  MT_CHECK(options.top >= 1, "autoplan: --top {} must be at least 1", options.top);
  return Search(base, world_size, hardware, options).run();
}

}  // namespace meshtrain::autoplan
