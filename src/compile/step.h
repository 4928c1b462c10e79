// A flat training step compiled for one rank: the config's step built as
// one global graph, laid out on the [parallel] mesh, propagated, lowered for
// the rank and put through the lowered-step passes, and scheduled. The
// checks of what a run on N ranks needs of the config live here too.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "compile/train_step.h"
#include "config/config.h"
#include "graph/schedule.h"
#include "sched/estimate.h"
#include "sched/hardware.h"
#include "sched/kernel_times.h"
#include "sharding/planner.h"
#include "spmd/lower.h"
#include "spmd/propagate.h"

namespace meshtrain::compile {

// Checks what a run on `world_size` ranks needs of the config (the
// [parallel] degrees multiply to the rank count, the global batch divides by
// the data-parallel degree) and returns the mesh. Throws naming the key.
sharding::DeviceMesh check_parallel_config(const config::TrainConfig& config, int world_size);

// How the config's step is built beyond the model and the optimizer
// (clipping, compute dtype, split loss, microbatches).
StepOptions step_options(const config::TrainConfig& config);
// The training step of a config as one global graph (forward, backward,
// clipping, AdamW), after the step pass pipeline.
TrainStepGraph build_step(const config::TrainConfig& config, graph::Graph& g);

// A step laid out on `world_size` ranks by the [parallel] plan: the mesh,
// every value's and node's layout (spmd::propagate), and `rank`'s lowered
// graph. Any rank's, on any machine: nothing runs.
struct StepLayout {
  std::shared_ptr<sharding::Planner> planner;  // on the mesh (sharding::shared_planner)
  spmd::Sharding sharding;
  spmd::LoweredGraph lowered;
  const sharding::DeviceMesh& mesh() const { return planner->mesh(); }
};
// The step laid out, lowered for `rank` and put through the lowered-step
// passes; the reordering (config.schedule.reorder) costs the step on
// `hardware` and keeps within config.schedule.memory_budget_mb.
// Benchmark mode: `measured_kernels` is called with the lowered graph before
// the passes and returns the kernel times they cost compute nodes with (it
// must outlive the call), or null for the roofline.
using MeasureKernels = std::function<const sched::KernelTimes*(const graph::Graph& lowered)>;
// The most ranks a step is laid out for without running it (lower, estimate):
// each collective node lists its group's ranks, so time and memory grow with
// the groups (an 8B step on 2^17 ranks of FSDP: about 20 s and 1 GiB here).
inline constexpr int64_t kMaxLaidOutRanks = int64_t{1} << 17;
StepLayout lay_out_step(const config::TrainConfig& config, const graph::Graph& g, const TrainStepGraph& step,
                        int world_size, int rank, const sched::HardwareProfile& hardware,
                        const MeasureKernels& measured_kernels = {});
// A global graph laid out on `planner`'s mesh and lowered for `rank`: every
// value's layout (spmd::propagate from the `given` layouts, outputs as
// `deliver` says) and the rank's local graph with its collectives
// (spmd::lower). Every step and pipeline graph is laid out here.
struct LaidOut {
  spmd::Sharding sharding;
  spmd::LoweredGraph lowered;
};
LaidOut lay_out_graph(const graph::Graph& g, sharding::Planner& planner, int rank,
                      const std::map<graph::ValueId, sharding::Layout>& given,
                      const std::map<graph::ValueId, sharding::Layout>& deliver, const spmd::LowerOptions& options = {},
                      const spmd::PropagationOptions& propagation = {});

// Every value of `g` mapped to itself: the value map of a graph that runs as
// it is (one rank, no layout).
std::map<graph::ValueId, graph::ValueId> identity_values(const graph::Graph& g);

// The passes rank `rank`'s lowered graph on `mesh` goes through before it
// is scheduled (sched::lowered_step_pipeline), as config's keys ask: tp's
// collectives cut into steps under their GEMMs (parallel.async_tp),
// collectives bucketed, waits sunk, and collectives started early where
// `device`'s profile gains by it, within the memory budget. `schedule_of`
// gives the schedule (with its memory plan) a graph of the step in some
// order runs; the passes cost orders with it on `device`.
using ScheduleOf = std::function<graph::Schedule(const graph::Graph&)>;
void run_lowered_step_passes(const config::TrainConfig& config, const sched::RankDevice& device,
                             const sharding::DeviceMesh& mesh, int rank, const ScheduleOf& schedule_of,
                             graph::Graph& lowered);
// The profile config.schedule.hardware names ("auto": cpu-2core, as the
// executor runs on CPUs).
sched::HardwareProfile scheduling_hardware(const config::TrainConfig& config);
// What a trainer of `world_size` ranks holds beside its step: the global
// batch (tokens and targets) it cuts its rows from, on several ranks.
double batch_buffer_bytes(const config::TrainConfig& config, int world_size);
// config.schedule.memory_budget_mb in bytes (0: none); a rank's step
// allocation (sched::MemoryEstimate::allocated_bytes) and batch_buffer_bytes
// must fit in it.
double memory_budget_bytes(const config::TrainConfig& config);
// The error for a step that needs `needed_bytes` (allocated) on `rank`, over
// the budget: it names the smallest budget that fits.
std::string over_budget_message(const config::TrainConfig& config, double needed_bytes, int rank);

// A global output's value in the graph that runs (the lowered graph, or
// the global one on one rank): the output at the same place.
std::map<graph::ValueId, graph::ValueId> delivered_outputs(const graph::Graph& global, const graph::Graph& running);
// The schedule a rank runs: `running` (the lowered step, or the global one;
// `values` maps each global value to its value there) with every output
// fetched and the parameters and moments updated in place where the memory
// plan can.
graph::Schedule schedule_step(const graph::Graph& global, const TrainStepGraph& step, const graph::Graph& running,
                              const std::map<graph::ValueId, graph::ValueId>& values);

// Benchmark mode times kernels on this machine's CPUs: the schedule's
// hardware profile must describe it (shared_host); throws naming the key.
void check_benchmark_hardware(const sched::HardwareProfile& hardware);

}  // namespace meshtrain::compile
