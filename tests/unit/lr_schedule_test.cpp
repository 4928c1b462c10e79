// The learning-rate schedule (lr_scheduler.*): warmup then none, linear or
// cosine decay to min_lr_ratio, against values worked out by hand, and the
// trainer's steps taking them (the lr each step reports is the one it used).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

using namespace meshtrain;

namespace {

// lr 1e-3, 2 warmup steps, 12 steps, down to 0.1 of it: after the warmup the
// decay runs over steps 3..12, progress (step - 2) / 10.
config::TrainConfig schedule(config::LrDecay decay) {
  config::TrainConfig c;
  c.optimizer.lr = 1e-3;
  c.lr_scheduler = {.warmup_steps = 2, .decay = decay, .min_lr_ratio = 0.1};
  c.training.steps = 12;
  return c;
}

struct LrPoint {
  int64_t step;
  double lr;
};

void expect_schedule(const config::TrainConfig& c, const std::vector<LrPoint>& points) {
  for (const LrPoint& p : points) EXPECT_NEAR(c.lr_at(p.step), p.lr, 1e-15 * p.lr) << "step " << p.step;
}

}  // namespace

TEST(LrSchedule, WarmupIsLinearFromTheFirstStep) {
  for (const auto decay : {config::LrDecay::none, config::LrDecay::linear, config::LrDecay::cosine})
    expect_schedule(schedule(decay), {{1, 5e-4}, {2, 1e-3}});
}

TEST(LrSchedule, NoneHoldsTheRateAfterTheWarmup) {
  expect_schedule(schedule(config::LrDecay::none), {{3, 1e-3}, {7, 1e-3}, {12, 1e-3}});
}

// Linear: 1e-3 x (1 - 0.9 x progress): step 3 is 0.1 of the way (9.1e-4),
// step 7 half (5.5e-4), step 12 the end (1e-4).
TEST(LrSchedule, LinearFallsToTheMinimumAtTheLastStep) {
  expect_schedule(schedule(config::LrDecay::linear), {{3, 9.1e-4}, {7, 5.5e-4}, {11, 1.9e-4}, {12, 1e-4}});
}

// Cosine: 1e-3 x (0.1 + 0.45 x (1 + cos(pi x progress))): half way it is
// the linear one's 5.5e-4; at 0.2, cos(0.2 pi) = (1 + sqrt 5) / 4.
TEST(LrSchedule, CosineMeetsLinearHalfWayAndEndsAtTheMinimum) {
  const double at_fifth = 1e-3 * (0.1 + 0.45 * (1 + (1 + std::sqrt(5.0)) / 4));
  expect_schedule(schedule(config::LrDecay::cosine), {{4, at_fifth}, {7, 5.5e-4}, {12, 1e-4}});
}

TEST(LrSchedule, NoWarmupStartsDecayingAtStepOne) {
  config::TrainConfig c = schedule(config::LrDecay::linear);
  c.lr_scheduler.warmup_steps = 0;
  expect_schedule(c, {{1, 1e-3 * (1 - 0.9 / 12)}, {12, 1e-4}});
}

// The trainer runs each step at the schedule's rate: 5 steps of linear decay
// with one warmup step on a one-block model.
TEST(LrSchedule, TrainerStepsReportTheLinearSchedule) {
  config::TrainConfig c;
  c.model = {.dim = 32, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64, .vocab_size = 256};
  c.data.path = std::string(MESHTRAIN_SOURCE_DIR) + "/data/corpus.txt";
  c.data.batch_size = 2;
  c.data.seq_len = 16;
  c.optimizer.lr = 1e-3;
  c.lr_scheduler = {.warmup_steps = 1, .decay = config::LrDecay::linear, .min_lr_ratio = 0.2};
  c.training.steps = 5;
  c.checkpoint.folder.clear();
  train::Trainer trainer(c);
  // Progress (step - 1) / 4 after the warmup: 1e-3 x (1 - 0.8 x progress).
  for (const double want : {1e-3, 8e-4, 6e-4, 4e-4, 2e-4}) {
    const auto m = trainer.step();
    EXPECT_NEAR(m.lr, want, 1e-15 * want) << "step " << m.step;
  }
}
