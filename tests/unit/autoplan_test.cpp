// autoplan's plan space and search: every layout it lists is one the config
// can run, the ones it cannot are said with the check's reason, its lower
// bounds stay below what the estimate costs, the plans it drops by its
// bounds are (costed anyway) no better than the K best it keeps, and the
// best plan written out loads back as the same config.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "autoplan/search.h"
#include "compile/step.h"
#include "test_util.h"

using namespace meshtrain;
using mtest::contains;
using mtest::message_of;

namespace {

config::TrainConfig debug_config(std::vector<std::pair<std::string, std::string>> overrides = {}) {
  return config::load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/debug.toml", overrides);
}

std::string degrees_of(const autoplan::Plan& p) {
  return fmt::format("{}x{}x{}x{}x{}", p.dp_replicate, p.dp_shard, p.tp, p.cp, p.pp);
}

const sched::HardwareProfile& h100() {
  static const sched::HardwareProfile hardware = sched::builtin_hardware("h100-sxm");
  return hardware;
}

// A search of `base` on 4 ranks keeping the 3 best, on 2 threads.
autoplan::SearchResult search_top3(const config::TrainConfig& base, bool check_screen = false) {
  autoplan::SearchOptions options;
  options.top = 3;
  options.threads = 2;
  options.check_screen = check_screen;
  return autoplan::search_plans(base, 4, h100(), options);
}

// Up to `most` of the plans dropped for `reason` (spread over them), each
// estimated in full: none is faster than the third best kept. How many.
int expect_dropped_no_better(const autoplan::SearchResult& result, const config::TrainConfig& base,
                             const std::string& reason, size_t most) {
  std::vector<const autoplan::DroppedPlan*> dropped;
  for (const auto& d : result.dropped)
    if (d.reason.starts_with(reason)) dropped.push_back(&d);
  const double third = result.best(3).back()->step_us;
  int checked = 0;
  for (size_t i = 0; i < dropped.size(); i += (dropped.size() + most - 1) / most) {
    const auto e = estimate::estimate_training(autoplan::apply_plan(base, dropped[i]->plan, 4), 4, 0, h100());
    EXPECT_GE(e.time.step_us, third * (1 - 1e-9)) << autoplan::overrides_text(dropped[i]->overrides);
    ++checked;
  }
  return checked;
}

}  // namespace

// The debug model (16 heads, 16 kv heads, 6 layers, batch 8, seq 128) on 4
// ranks: every degree product of 4 appears, each layout passes the run's
// own checks, and each pipeline layout runs at least as many microbatches
// as stages.
TEST(Autoplan, EveryLayoutListedIsOneTheConfigCanRun) {
  const config::TrainConfig base = debug_config();
  std::vector<autoplan::RejectedPlan> rejected;
  const auto layouts = autoplan::enumerate_layouts(base, 4, {}, rejected);
  std::set<std::string> degrees;
  for (const autoplan::Plan& p : layouts) {
    const config::TrainConfig planned = autoplan::apply_plan(base, p, 4);
    EXPECT_NO_THROW(compile::check_parallel_config(planned, 4)) << degrees_of(p);
    EXPECT_EQ(p.dp_replicate * p.dp_shard * p.tp * p.cp * p.pp, 4);
    if (p.pp > 1) {
      EXPECT_GE(p.pp_microbatches, p.pp);
    }
    if (p.tp > 1) {
      EXPECT_TRUE(p.sequence_parallel && p.loss_parallel);
    }
    degrees.insert(degrees_of(p));
  }
  // 15 products of (dp_replicate, dp_shard, tp, cp, pp) multiply to 4: 5 dims, one 4 or two 2s.
  EXPECT_EQ(degrees.size(), 15u);
  for (const char* d : {"1x4x1x1x1", "4x1x1x1x1", "1x2x2x1x1", "1x1x1x2x2", "1x1x4x1x1", "2x1x1x1x2"})
    EXPECT_TRUE(degrees.count(d)) << d;
  // The five schedules appear for a 2-stage pipeline over 2 data-parallel ranks (4 sequences each: 2 or 4
  // microbatches).
  std::set<int> schedules;
  for (const autoplan::Plan& p : layouts)
    if (p.pp == 2 && p.dp_shard == 2) schedules.insert(static_cast<int>(p.pp_schedule));
  EXPECT_EQ(schedules.size(), 5u);
}

// A mixture of experts (4 experts): ep takes 1, 2 or 4 of the dp_shard
// ranks it divides, and under tp the experts split over tp or not.
TEST(Autoplan, ExpertsSplitOverTheShardedDataParallelRanks) {
  const config::TrainConfig base = debug_config({{"model.n_experts", "4"}, {"model.moe_ffn_dim", "128"}});
  std::vector<autoplan::RejectedPlan> rejected;
  const auto layouts = autoplan::enumerate_layouts(base, 4, {}, rejected);
  std::set<std::string> seen;
  for (const autoplan::Plan& p : layouts) {
    EXPECT_NO_THROW(compile::check_parallel_config(autoplan::apply_plan(base, p, 4), 4)) << degrees_of(p);
    EXPECT_TRUE(p.dp_shard % p.ep == 0 || (p.cp > 1 && p.ep % p.cp == 0)) << degrees_of(p) << " ep " << p.ep;
    seen.insert(fmt::format("{} ep {} etp {}", degrees_of(p), p.ep, p.expert_tp));
  }
  for (const char* want : {"1x4x1x1x1 ep 4 etp 1", "1x4x1x1x1 ep 2 etp 1", "2x2x1x1x1 ep 2 etp 1",
                           "1x2x2x1x1 ep 2 etp 2", "1x2x2x1x1 ep 1 etp 1"})
    EXPECT_TRUE(seen.count(want)) << want;
}

// What the config cannot run is said with the check's own words: 16 kv
// heads do not split over tp 3, nor a batch of 8 over 3 data-parallel ranks.
TEST(Autoplan, ALayoutTheConfigCannotRunIsRejectedWithTheReason) {
  const config::TrainConfig base = debug_config();
  std::vector<autoplan::RejectedPlan> rejected;
  autoplan::enumerate_layouts(base, 3, {}, rejected);
  bool heads = false, batch = false;
  for (const auto& r : rejected) {
    heads |= r.plan.tp == 3 && contains(r.reason, "model.n_heads 16 must divide by parallel.tp 3");
    batch |= r.plan.dp_shard == 3 && contains(r.reason, "data.batch_size 8");
  }
  EXPECT_TRUE(heads);
  EXPECT_TRUE(batch);
}

// 7 ranks with a batch of 4: no factor of 7 splits 16 heads, 4 sequences,
// a sequence of 128 in 14 chunks or 8 units into 7 stages fed by 7
// microbatches. One error, naming the checks that failed.
TEST(Autoplan, NoLegalPlanIsOneErrorSayingWhy) {
  const config::TrainConfig base = debug_config({{"data.batch_size", "4"}});
  const std::string message =
      message_of([&] { autoplan::search_plans(base, 7, sched::builtin_hardware("h100-sxm"), {}); });
  EXPECT_TRUE(contains(message, "no plan lays the config out on 7 ranks")) << message;
  EXPECT_TRUE(contains(message, "parallel.tp 7")) << message;
}

// A budget of 105 KB a rank, where the debug model's weights and states
// take 59 MiB: one error each time, saying what stops every plan. With the
// embedding tied (no pipeline), every layout's weights alone are over it;
// untied, a pipeline rank's bound adds a stage's weights gathered whole
// (the fewest units it can hold, each at the fewest parameters of a unit).
TEST(Autoplan, NothingFitsIsOneErrorSayingHowMuchTheLeastNeeds) {
  autoplan::SearchOptions options;
  options.budget_gib = 1e-4;
  const auto hardware = sched::builtin_hardware("h100-sxm");
  const std::string tied = message_of([&] {
    autoplan::search_plans(debug_config({{"model.tie_embeddings", "true"}}), 4, hardware, options);
  });
  EXPECT_TRUE(contains(tied, "no plan of the 10 legal layouts could be costed")) << tied;
  // 6 layers of 852480 parameters, the final norm's 256 and the tied table's 65536: 5180672, 12 bytes each (f32
  // weight, two f32 moments) over 4 shards: 14.8 MiB.
  EXPECT_TRUE(contains(tied, "memory: its master weights and optimizer states alone take 14.8 MiB of the 0.1 MiB"))
      << tied;
  options.top = 1;
  const std::string untied = message_of([&] { autoplan::search_plans(debug_config(), 4, hardware, options); });
  EXPECT_TRUE(contains(untied, "could be costed")) << untied;
  EXPECT_TRUE(contains(untied, "optimizer states with a stage's weights gathered alone take")) << untied;
}

// The search on the debug model: every costed plan's lower bound is below
// its estimated compute (a pipeline's: its step), and every plan dropped by the bound, costed here
// anyway, is no faster than the K-th best plan kept.
TEST(Autoplan, PlansDroppedByTheBoundAreNoBetterThanTheBestKept) {
  // 2 layers (4 pipeline units) keep each estimate short for the sanitizer build.
  const config::TrainConfig base = debug_config({{"data.batch_size", "16"}, {"model.n_layers", "2"}});
  const autoplan::SearchResult result = search_top3(base);
  ASSERT_EQ(result.best(3).size(), 3u);
  for (const auto& c : result.costed) {
    const auto bounds = autoplan::lower_bounds(autoplan::apply_plan(base, c.plan, 4), 4, h100());
    // A pipeline's bound holds its bubble: a bound of the step, not of the rank's compute.
    EXPECT_LE(bounds.compute_us, (c.plan.pp > 1 ? c.step_us : c.compute_us) * (1 + 1e-9))
        << autoplan::overrides_text(c.overrides);
  }
  EXPECT_GT(expect_dropped_no_better(result, base, "bound:", 16), 0);  // the bound dropped some
  // The fastest first, and each as the overrides that make it.
  for (size_t i = 1; i < result.best(10).size(); ++i)
    EXPECT_LE(result.best(10)[i - 1]->step_us, result.best(10)[i]->step_us);
}

// On a slow network (a rank to a host, 0.5 GB/s between them) FSDP's
// traffic bounds the step: every costed plan's bound, compute and traffic,
// is at most its estimated step, and its memory bound at most its peak; the
// traffic bound is above the compute one somewhere, and drops plans.
TEST(Autoplan, TheTrafficBoundIsBelowEveryCostedStep) {
  const config::TrainConfig base = debug_config({{"data.batch_size", "16"}, {"model.n_layers", "2"}});
  sched::HardwareProfile slow = h100();
  slow.devices_per_host = 1;
  slow.nccl.inter_gbps = 0.5;
  autoplan::SearchOptions options;
  options.top = 3;
  options.threads = 2;
  const autoplan::SearchResult result = autoplan::search_plans(base, 4, slow, options);
  int traffic_bound = 0;
  for (const auto& c : result.costed) {
    const auto bounds = autoplan::lower_bounds(autoplan::apply_plan(base, c.plan, 4), 4, slow);
    EXPECT_LE(bounds.step_us, c.step_us * (1 + 1e-9)) << autoplan::overrides_text(c.overrides);
    EXPECT_LE(bounds.memory_bytes, c.peak_bytes * (1 + 1e-9)) << autoplan::overrides_text(c.overrides);
    traffic_bound += bounds.communication_us > bounds.compute_us;
  }
  EXPECT_GT(traffic_bound, 0);
  EXPECT_TRUE(std::any_of(result.dropped.begin(), result.dropped.end(),
                          [](const auto& d) { return contains(d.reason, "FSDP gathers"); }));
}

// The fastest plan as a whole config (what --out writes) loads back as the
// same keys, and its overrides on the user's config make the same config.
TEST(Autoplan, TheBestPlanWrittenOutLoadsBackAsTheSameConfig) {
  const config::TrainConfig base = debug_config({{"model.n_layers", "2"}});
  autoplan::SearchOptions options;
  options.top = 1;
  const autoplan::SearchResult result = autoplan::search_plans(base, 4, sched::builtin_hardware("h100-sxm"), options);
  const autoplan::CostedPlan& best = *result.best(1).front();
  const config::TrainConfig planned = autoplan::apply_plan(base, best.plan, 4);
  const auto dir = std::filesystem::temp_directory_path() / "meshtrain_autoplan_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "best.toml").string();
  std::ofstream(path) << config::config_toml(planned);
  EXPECT_EQ(config::config_values(config::load_config(path, {})), config::config_values(planned));
  auto overrides = best.overrides;
  overrides.insert(overrides.begin(), {"model.n_layers", "2"});
  const config::TrainConfig overridden =
      config::load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/debug.toml", overrides);
  EXPECT_EQ(config::config_values(overridden), config::config_values(planned));
  std::filesystem::remove_all(dir);
}

// The global step's compute is kept per model: a model of 2 layers after
// one of 6, on the same ranks and profile, is costed anew (less), and the
// first again gives what it gave.
TEST(Autoplan, TheGlobalComputeIsKeptPerModel) {
  const auto hardware = sched::builtin_hardware("h100-sxm");
  const double six = autoplan::global_compute(debug_config(), 4, hardware).total_us();
  const double two = autoplan::global_compute(debug_config({{"model.n_layers", "2"}}), 4, hardware).total_us();
  EXPECT_LT(two, six * 0.6);
  EXPECT_EQ(autoplan::global_compute(debug_config(), 4, hardware).total_us(), six);
  EXPECT_EQ(autoplan::global_compute(debug_config({{"model.n_layers", "2"}}), 4, hardware).layer_us.size(), 2u);
}

// The screen's layer counts: 2 and 4 without a pipeline; with one, the
// fewest that leave each stage its share of the remainder, and one more a
// stage; none where the screen would not cost under half the estimate.
TEST(Autoplan, TheScreenEstimatesFewerLayersThatExtrapolate) {
  auto layers_of = [](std::vector<std::pair<std::string, std::string>> overrides) {
    return autoplan::screen_layers(debug_config(std::move(overrides)));
  };
  using Layers = std::optional<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(layers_of({{"model.n_layers", "32"}}), (Layers{{2, 4}}));
  EXPECT_EQ(layers_of({{"model.n_layers", "6"}}), Layers{});  // 2 + 4 layers: no cheaper
  // 34 units over 4 stages: 2 left over, so 6 and 10 units (4 and 8 layers).
  EXPECT_EQ(layers_of({{"model.n_layers", "32"}, {"parallel.pp", "4"}}), (Layers{{4, 8}}));
  // Over 2 stages none is left over: 4 and 6 units.
  EXPECT_EQ(layers_of({{"model.n_layers", "32"}, {"parallel.pp", "2"}}), (Layers{{2, 4}}));
  // 8 stages: 8 and 16 layers of 32 would not be cheaper.
  EXPECT_EQ(layers_of({{"model.n_layers", "32"}, {"parallel.pp", "4"}, {"parallel.pp_schedule", "interleaved_1f1b"}}),
            Layers{});
}

// On a 12-layer model the screen drops plans before their full estimate
// (some after its first estimate); each it drops estimates in full no
// faster than the best kept, every
// costed plan's screen is within its 2% margin of the full estimate, and
// the search finds the exhaustive search's best.
TEST(Autoplan, PlansTheScreenDropsAreNoBetterThanTheBestKept) {
  const config::TrainConfig base = debug_config({{"data.batch_size", "16"}, {"model.n_layers", "12"}});
  const autoplan::SearchResult screened = search_top3(base), checked = search_top3(base, /*check_screen=*/true);
  EXPECT_EQ(screened.best(1).front()->step_us, checked.best(1).front()->step_us);
  EXPECT_GT(expect_dropped_no_better(screened, base, "screen:", 8), 0);  // the screen dropped some
  // Some after the first estimate alone, which already took too long.
  EXPECT_GT(expect_dropped_no_better(screened, base, "screen: its step with 2 layers alone", 4), 0);
  int screens = 0;
  for (const auto& c : checked.costed) {
    if (c.screen_step_us == 0) continue;
    EXPECT_NEAR(c.screen_step_us / c.step_us, 1.0, autoplan::kScreenMargin) << autoplan::overrides_text(c.overrides);
    ++screens;
  }
  EXPECT_GT(screens, 10);
}
