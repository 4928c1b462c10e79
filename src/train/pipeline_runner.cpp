#include "train/pipeline_runner.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/copy.h"
#include "core/error.h"
#include "core/file_io.h"
#include "parallel/plan.h"
#include "sched/schedule.h"
#include "sharding/local_chunk.h"
#include "sharding/redistribute.h"
#include "spmd/lower.h"
#include "train/trainer.h"

namespace meshtrain::train {

namespace {

// The source values `part` reads that are not parameters.
std::vector<graph::ValueId> non_parameter_reads(const graph::Graph& joint, const graph::ExtractedGraph& part) {
  std::vector<graph::ValueId> out;
  for (const graph::ValueId v : part.reads)
    if (joint.value(v).kind != graph::ValueKind::parameter) out.push_back(v);
  return out;
}

// Rows k, k + m, k + 2m, ... of a [batch, seq] tensor into `out` [batch / m, seq].
void take_microbatch(const Tensor& batch, int64_t k, int64_t m, Tensor& out) {
  const size_t row_bytes = static_cast<size_t>(batch.shape()[1]) * dtype_size(batch.dtype());
  const auto* from = static_cast<const std::byte*>(batch.raw());
  auto* to = static_cast<std::byte*>(out.raw());
  for (int64_t r = 0; r < out.shape()[0]; ++r)
    copy_bytes(to + static_cast<size_t>(r) * row_bytes, from + static_cast<size_t>(r * m + k) * row_bytes, row_bytes);
}

}  // namespace

namespace {}  // namespace

PipelineRunner::PipelineRunner(const config::TrainConfig& config, comm::ProcessGroupPtr world,
                               compile::PipelineRank compiled, const std::map<std::string, Tensor>& whole)
    : config_(config), world_(world), place_(std::move(compiled.place)) {
  MT_ASSERT(world != nullptr && world->size() == place_.mesh.num_ranks() && world->rank() == place_.rank,
            "the pipeline runner's world ({} ranks) is not the one its step was compiled for ({} ranks, rank {})",
            world ? world->size() : 0, place_.mesh.num_ranks(), place_.rank);
  const int stage_rank = place_.stage_rank, pp_rank = place_.pp_rank;
  if (!place_.stage_mesh) {
    group_ = world;
  } else {
    // Both splits are collectives over the world, made by every rank in this order.
    comm::ProcessGroupPtr stage = world->split(pp_rank, stage_rank, fmt::format("pp_stage_{}", pp_rank));
    group_ = world->split(stage_rank, pp_rank, fmt::format("pp_{}", stage_rank));
    stage_groups_ = std::make_unique<sharding::MeshGroups>(*place_.stage_mesh, std::move(stage));
    stage_planner_ = sharding::shared_planner(*place_.stage_mesh);
  }
  const int64_t m = place_.schedule.microbatches;
  const bool split = place_.splits_backward;
  auto executor_for = [&](const graph::Graph& g) -> std::unique_ptr<runtime::Executor> {
    if (g.num_nodes() == 0) return nullptr;
    return std::make_unique<runtime::Executor>(g, sched::make_schedule(g, g.outputs()), stage_groups_.get());
  };
  auto local_part = [&](const Tensor& t, const sharding::Layout& layout) {
    return place_.stage_mesh ? sharding::local_piece(t, layout, *place_.stage_mesh, stage_groups_->coordinate())
                             : t.clone();
  };
  std::vector<std::string> names;
  std::vector<Tensor> grads;
  std::vector<sharding::Layout> layouts;  // of each parameter, on the stage mesh
  for (const int s : place_.stages()) {
    auto st = std::make_unique<Stage>();
    const auto compiled_stage = compiled.stages.find(s);
    MT_ASSERT(compiled_stage != compiled.stages.end(), "pipeline rank {}'s stage {} was not compiled", pp_rank, s);
    st->programs = std::move(compiled_stage->second);
    const compile::PipelineStage& p = st->programs;
    st->forward.part = &p.forward;
    st->backward.part = &p.backward;
    st->backward_input.part = &p.backward_input;
    st->backward_weight.part = &p.backward_weight;
    st->forward.executor = executor_for(p.forward.graph);
    st->unshard.part = &p.unshard;
    st->unshard.executor = executor_for(p.unshard.graph);
    if (split) {
      st->backward_input.executor = executor_for(p.backward_input.graph);
      st->backward_weight.executor = executor_for(p.backward_weight.graph);
      st->kept_after_forward = non_parameter_reads(p.joint, p.backward_input);
      for (const graph::ValueId v : non_parameter_reads(p.joint, p.backward_weight))
        if (std::find(st->kept_after_forward.begin(), st->kept_after_forward.end(), v) == st->kept_after_forward.end())
          st->kept_after_forward.push_back(v);
      st->kept_after_input = non_parameter_reads(p.joint, p.backward_weight);
    } else {
      st->backward.executor = executor_for(p.backward.graph);
      st->kept_after_forward = non_parameter_reads(p.joint, p.backward);
    }
    for (size_t i = 0; i < p.parameter_names.size(); ++i) {
      const std::string& name = p.parameter_names[i];
      const sharding::Layout layout = place_.stage_mesh ? p.parameter_layouts.at(name) : sharding::Layout{};
      params_[name] = local_part(whole.at(name), layout);
      const Shape& local = params_[name].shape();
      exp_avg_[name] = Tensor::zeros(local, config.optimizer.state_dtype);
      exp_avg_sq_[name] = Tensor::zeros(local, config.optimizer.state_dtype);
      st->gradient_sums.push_back(Tensor::zeros(local, DType::f32));
      if (place_.stage_mesh) {
        const graph::ValueInfo& pending = p.joint.value(p.gradients[i]).info;
        st->pending_sums.push_back(Tensor::zeros(pending.shape, DType::f32));
      }
      names.push_back(name);
      grads.push_back(st->gradient_sums.back());
      layouts.push_back(layout);
    }
    stages_[s] = std::move(st);
  }
  MT_CHECK(!stages_.empty(), "pipeline rank {} holds no stage", group_->rank());
  const std::vector<parallel::PpAction>& actions = place_.schedule.actions.at(static_cast<size_t>(group_->rank()));
  for (size_t i = 0; i < actions.size(); ++i)
    if (parallel::is_compute(actions[i].type)) last_compute_ = i;
  kept_between_runs_ = parallel::pp_stages_kept_between_runs(place_.schedule, group_->rank());
  for (int64_t k = 0; k < m; ++k) {
    tokens_.push_back(Tensor::empty({place_.microbatch_rows, config.data.seq_len}, DType::i64));
    targets_.push_back(Tensor::empty({place_.microbatch_rows, config.data.seq_len}, DType::i64));
  }
  // The once-a-step graphs compile_rank built for this rank's parameters, in the order gathered above.
  update_ = std::move(compiled.update);
  MT_ASSERT(update_.names == names, "pipeline rank {}: the update's parameters are not its stages'", pp_rank);
  count_run_ =
      std::make_unique<runtime::Executor>(update_.count, sched::make_schedule(update_.count, update_.count.outputs()));
  update_run_ = std::make_unique<runtime::Executor>(
      update_.update, sched::make_schedule(update_.update, update_.update.outputs(), update_.write_backs),
      stage_groups_.get());
  squares_run_ = executor_for(update_.squares);
  for (size_t i = 0; i < names.size(); ++i) squares_run_->bind(update_.square_gradients[i], grads[i]);
  lr_ = Tensor::empty({}, DType::f64);
  adam_step_ = Tensor::empty({}, DType::i64);
  squares_ = Tensor::empty({}, DType::f64);
  for (size_t i = 0; i < names.size(); ++i) {
    update_run_->bind(update_.parameters[i], params_.at(names[i]));
    update_run_->bind(update_.gradients[i], grads[i]);
    update_run_->bind(update_.exp_avg[i], exp_avg_.at(names[i]));
    update_run_->bind(update_.exp_avg_sq[i], exp_avg_sq_.at(names[i]));
  }
  update_run_->bind(update_.sum_of_squares, squares_);
  update_run_->bind(update_.lr, lr_);
  update_run_->bind(update_.step, adam_step_);
  const Shape batch{config.data.batch_size, config.data.seq_len};
  global_tokens_ = Tensor::empty(batch, DType::i64);
  global_targets_ = Tensor::empty(batch, DType::i64);
}

PipelineRunner::~PipelineRunner() = default;

std::vector<int> PipelineRunner::stages() const { return place_.stages(); }

PipelineRunner::Stage& PipelineRunner::local_stage(int stage) {
  const auto it = stages_.find(stage);
  MT_CHECK(it != stages_.end(), "pipeline rank {}: the schedule has an action of stage {}, which lives on rank {}",
           group_->rank(), stage, place_.schedule.rank_of_stage.at(static_cast<size_t>(stage)));
  return *it->second;
}

int PipelineRunner::peer_tag(int from_stage, bool forward, size_t slot) const {
  MT_ASSERT(slot < 2, "pipeline stage {} sends value {} one way: at most two cross (PipelineStage::to_next)",
            from_stage, slot);
  return (4 * from_stage + (forward ? 0 : 2) + static_cast<int>(slot)) % (1 << 20);
}

void PipelineRunner::run(Stage& st, Program& program, int mb, const std::vector<graph::ValueId>& keep) {
  // The unshard program (mb -1) keeps its outputs for the step.
  std::map<graph::ValueId, Tensor>& values = mb < 0 ? st.step_held : held_[{st.programs.index, mb}];
  if (!program.executor) return;
  const graph::ExtractedGraph& part = *program.part;
  const graph::Graph& joint = st.programs.joint;
  runtime::Executor& ex = *program.executor;
  for (const graph::ValueId v : part.reads) {
    const graph::Value& source = joint.value(v);
    if (source.kind == graph::ValueKind::parameter) {
      ex.bind(part.values.at(v), params_.at(source.name));
      continue;
    }
    if (const auto held = st.step_held.find(v); held != st.step_held.end()) {
      ex.bind(part.values.at(v), held->second);
      continue;
    }
    const auto it = values.find(v);
    MT_CHECK(it != values.end(),
             "pipeline stage {}, microbatch {}: a program reads {}, which no earlier action gave it", st.programs.index,
             mb, joint.describe_value(v));
    ex.bind(part.values.at(v), it->second);
  }
  const auto t0 = std::chrono::steady_clock::now();
  ex.run();
  if (mb >= 0)
    for (const graph::ValueId v : part.reads)
      if (std::find(keep.begin(), keep.end(), v) == keep.end()) values.erase(v);
  for (const graph::ValueId v : part.outputs) values[v] = ex.fetch(part.values.at(v)).clone();
  stats_.busy_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void PipelineRunner::note_held() {
  double bytes = 0;
  int pairs = 0;
  for (const auto& [key, values] : held_) {
    pairs += values.empty() ? 0 : 1;
    for (const auto& [v, t] : values) bytes += static_cast<double>(t.nbytes());
  }
  for (const auto* receives : {&receives_f_, &receives_b_})
    for (const auto& [key, values] : *receives)
      for (const InFlight& r : values) bytes += static_cast<double>(r.tensor.nbytes());
  for (const InFlight& send : sends_) bytes += static_cast<double>(send.tensor.nbytes());
  stats_.held_bytes_peak = std::max(stats_.held_bytes_peak, bytes);
  stats_.held_pairs_peak = std::max(stats_.held_pairs_peak, pairs);
}

void PipelineRunner::reduce_gradients(Stage& st) {
  const compile::PipelineStage& p = st.programs;
  for (size_t i = 0; i < p.parameter_names.size(); ++i) {
    const std::string& name = p.parameter_names[i];
    const Tensor reduced = sharding::redistribute(
        st.pending_sums[i], models::llama_parameters(config_.model).at(name).shape, p.gradient_layouts.at(name),
        p.parameter_layouts.at(name), *stage_groups_, *stage_planner_);
    MT_CHECK(reduced.shape() == st.gradient_sums[i].shape(),
             "pipeline stage {}: {}'s reduced gradient is {}, its "
             "parameter {}",
             p.index, name, reduced.shape().to_string(), st.gradient_sums[i].shape().to_string());
    copy_bytes(st.gradient_sums[i].raw(), reduced.raw(), reduced.nbytes());
  }
}

void PipelineRunner::add_gradients(Stage& st, int mb) {
  std::map<graph::ValueId, Tensor>& values = held_[{st.programs.index, mb}];
  const bool first = st.backwards_done == 0;
  std::vector<Tensor>& sums = place_.stage_mesh ? st.pending_sums : st.gradient_sums;
  for (size_t i = 0; i < sums.size(); ++i) {
    auto node = values.extract(st.programs.gradients[i]);
    MT_CHECK(!node.empty(), "pipeline stage {}, microbatch {}: the gradient of {} was not computed", st.programs.index,
             mb, st.programs.parameter_names[i]);
    std::span<float> sum = sums[i].data<float>();
    const std::span<const float> g = std::as_const(node.mapped()).data<float>();
    if (first)
      std::copy(g.begin(), g.end(), sum.begin());
    else
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += g[j];
  }
  ++st.backwards_done;
}

void PipelineRunner::act(const parallel::PpAction& a) {
  using T = parallel::PpActionType;
  const int s = a.stage, mb = a.microbatch;
  const int last = place_.schedule.stages() - 1;
  const int me = group_->rank();
  auto rank_of = [&](int stage) { return place_.schedule.rank_of_stage.at(static_cast<size_t>(stage)); };
  // The values received for (s, mb) from a stage on another rank, held as `into` (its values, in order).
  auto take_received = [&](std::map<std::pair<int, int>, std::vector<InFlight>>& receives, const char* what,
                           const std::vector<graph::ValueId>& into) {
    auto node = receives.extract({s, mb});
    MT_CHECK(!node.empty(), "pipeline rank {}: {} of stage {}, microbatch {} is used before it was received", me, what,
             s, mb);
    const double begin = tracing_ ? since_start_us() : 0;
    MT_ASSERT(node.mapped().size() == into.size(), "pipeline rank {}: {} values received for {}", me,
              node.mapped().size(), into.size());
    for (size_t i = 0; i < into.size(); ++i) {
      node.mapped()[i].work->wait();
      held_[{s, mb}][into[i]] = node.mapped()[i].tensor;
    }
    if (tracing_) {
      waited_until_us_ = since_start_us();  // the action's compute starts once its input is here
      trace_.push_back(
          {fmt::format("wait {}{}", parallel::to_string(a), &receives == &receives_f_ ? " input" : " gradient"), true,
           begin, waited_until_us_});
    }
  };
  // Values of (s, mb) handed over in memory to stage `to` on this rank, as its values `into`.
  auto hand_over = [&](const std::vector<graph::ValueId>& values, int to, const std::vector<graph::ValueId>& into) {
    MT_ASSERT(values.size() == into.size(), "pipeline stage {} hands {} values to stage {}, which takes {}", s,
              values.size(), to, into.size());
    for (size_t i = 0; i < values.size(); ++i) {
      auto node = held_[{s, mb}].extract(values[i]);
      MT_CHECK(!node.empty(), "pipeline rank {}: stage {}, microbatch {} has no value to hand over", me, s, mb);
      held_[{to, mb}][into[i]] = std::move(node.mapped());
    }
  };
  auto take = [&](graph::ValueId v) {
    auto node = held_[{s, mb}].extract(v);
    MT_CHECK(!node.empty(), "pipeline rank {}: stage {}, microbatch {} has no value to send", me, s, mb);
    return node.mapped();
  };
  switch (a.type) {
    case T::forward: {
      Stage& st = local_stage(s);
      const compile::PipelineStage& p = st.programs;
      std::map<graph::ValueId, Tensor>& values = held_[{s, mb}];
      auto local = [&](const Tensor& t) {
        return place_.stage_mesh
                   ? sharding::local_piece(t, p.batch_layout, *place_.stage_mesh, stage_groups_->coordinate())
                   : t;
      };
      if (s == 0)
        values[p.input] = local(tokens_[static_cast<size_t>(mb)]);
      else if (rank_of(s - 1) != me)
        take_received(receives_f_, "the input activation", p.from_previous());
      if (s == last) {
        values[p.targets] = local(targets_[static_cast<size_t>(mb)]);
        values[p.count] = count_;
      }
      run(st, st.forward, mb, st.kept_after_forward);
      add_expert_load(st, mb);
      if (s == last) {
        loss_sum_ += static_cast<float>(take(p.output).get(0));  // microbatch order, as the single-rank graph adds
        if (p.aux_loss.valid()) aux_loss_sum_ += take(p.aux_loss).get(0);
      } else if (rank_of(s + 1) == me) {
        hand_over(p.to_next(), s + 1, local_stage(s + 1).programs.from_previous());
      }
      return;
    }
    case T::backward:
    case T::backward_input: {
      Stage& st = local_stage(s);
      const compile::PipelineStage& p = st.programs;
      if (s != last && rank_of(s + 1) != me) take_received(receives_b_, "the output gradient", p.from_next());
      const bool whole = a.type == T::backward;
      run(st, whole ? st.backward : st.backward_input, mb, whole ? std::vector<graph::ValueId>{} : st.kept_after_input);
      if (whole) add_gradients(st, mb);
      if (s != 0 && rank_of(s - 1) == me) hand_over(p.to_previous(), s - 1, local_stage(s - 1).programs.from_next());
      return;
    }
    case T::backward_weight: {
      Stage& st = local_stage(s);
      run(st, st.backward_weight, mb, {});
      add_gradients(st, mb);
      return;
    }
    case T::send_f:
    case T::send_b: {
      const bool forward = a.type == T::send_f;
      const compile::PipelineStage& p = local_stage(s).programs;
      const std::vector<graph::ValueId> values = forward ? p.to_next() : p.to_previous();
      for (size_t i = 0; i < values.size(); ++i) {
        Tensor t = take(values[i]);
        comm::WorkPtr work = group_->send(t, rank_of(forward ? s + 1 : s - 1), peer_tag(s, forward, i));
        sends_.push_back({std::move(t), std::move(work)});
      }
      return;
    }
    case T::unshard: {  // the weights' compute-dtype copies and gathers, for the microbatches until its RESHARD
      Stage& st = local_stage(s);
      run(st, st.unshard, -1, {});
      st.unsharded = true;
      return;
    }
    case T::reshard:
      local_stage(s).step_held.clear();
      local_stage(s).unsharded = false;
      return;
    case T::reduce_grad: {  // the step's sums reduced once, after the stage's last backward
      Stage& st = local_stage(s);
      const int64_t all = place_.schedule.microbatches * place_.accumulation;
      MT_CHECK(st.backwards_done == all, "pipeline stage {}: REDUCE_GRAD after {} of {} microbatches' gradients", s,
               st.backwards_done, all);
      if (place_.stage_mesh) reduce_gradients(st);
      return;
    }
    case T::recv_f:
    case T::recv_b: {
      const bool forward = a.type == T::recv_f;
      const compile::PipelineStage& p = local_stage(s).programs;
      const int from = forward ? s - 1 : s + 1;
      std::vector<InFlight>& receives = (forward ? receives_f_ : receives_b_)[{s, mb}];
      MT_ASSERT(receives.empty(), "pipeline rank {}: stage {}, microbatch {} receives twice", me, s, mb);
      const std::vector<graph::ValueId> values = forward ? p.from_previous() : p.from_next();
      for (size_t i = 0; i < values.size(); ++i) {
        const graph::ValueInfo info = p.joint.value(values[i]).info;
        Tensor t = Tensor::empty(info.shape, info.dtype);
        comm::WorkPtr work = group_->recv(t, rank_of(from), peer_tag(from, forward, i));
        receives.push_back({std::move(t), std::move(work)});
      }
      return;
    }
  }
}

std::vector<RowRange> PipelineRunner::rows_read() const {
  if (!place_.stage_mesh) return {};  // no data parallelism: every row
  // Microbatch j of all holds rows j, j + all, j + 2 all, ...; this rank takes its data-parallel part of each.
  const int64_t all = place_.schedule.microbatches * place_.accumulation;
  const sharding::LocalChunk part = sharding::local_chunk(Shape{place_.microbatch_rows, global_tokens_.shape()[1]},
                                                          stages_.begin()->second->programs.batch_layout,
                                                          *place_.stage_mesh, stage_groups_->coordinate());
  std::vector<RowRange> rows;
  for (int64_t j = 0; j < all; ++j)
    for (int64_t r = part.offset[0]; r < part.offset[0] + part.shape[0]; ++r)
      rows.push_back({r * all + j, r * all + j + 1});
  std::sort(rows.begin(), rows.end(), [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  return rows;
}

void PipelineRunner::count_targets() {
  Tensor& targets = global_targets_;
  const std::vector<RowRange> rows = rows_read();
  if (!rows.empty()) {  // rows no rank of this data-parallel group read count nothing here
    std::vector<bool> read(static_cast<size_t>(targets.shape()[0]));
    for (const RowRange& r : rows) std::fill(read.begin() + r.begin, read.begin() + r.end, true);
    const auto seq = static_cast<size_t>(targets.shape()[1]);
    std::span<int64_t> t = targets.data<int64_t>();
    for (size_t row = 0; row < read.size(); ++row)
      if (!read[row]) std::fill_n(t.begin() + static_cast<std::ptrdiff_t>(row * seq), seq, int64_t{-100});
  }
  count_run_->bind(update_.count_targets,
                   Tensor::view(const_cast<void*>(targets.raw()), {targets.shape().numel()}, DType::i64));
  count_run_->run();
  count_ = count_run_->fetch(update_.count.outputs()[0]).clone();
  if (!rows.empty()) {  // each data-parallel rank counted its rows: the batch's count is their sum
    const sharding::DeviceMesh& mesh = *place_.stage_mesh;
    stage_groups_->merged_group(parallel::data_parallel_dims(mesh)).all_reduce(count_)->wait();
  }
}

void PipelineRunner::take_microbatches(int64_t chunk) {
  const int64_t m = place_.schedule.microbatches, all = m * place_.accumulation;
  for (int64_t k = 0; k < m; ++k) {
    take_microbatch(global_tokens_, chunk * m + k, all, tokens_[static_cast<size_t>(k)]);
    take_microbatch(global_targets_, chunk * m + k, all, targets_[static_cast<size_t>(k)]);
  }
}

double PipelineRunner::evaluate() {
  using T = parallel::PpActionType;
  const std::vector<parallel::PpAction>& actions = place_.schedule.actions.at(static_cast<size_t>(group_->rank()));
  std::set<int> gathered;  // the stages whose schedule gathers their weights (FSDP)
  for (const parallel::PpAction& a : actions)
    if (a.type == T::unshard) gathered.insert(a.stage);
  const int last = place_.schedule.stages() - 1, me = group_->rank();
  auto rank_of = [&](int stage) { return place_.schedule.rank_of_stage.at(static_cast<size_t>(stage)); };
  const StepStats kept_stats = stats_;  // the last training step's, which the report shows
  const bool tracing = tracing_;        // a trace shows training steps only
  tracing_ = false;
  count_targets();
  loss_sum_ = 0;
  for (int s : gathered) act({s, T::unshard, 0});
  // Each microbatch through every stage in turn: on every rank the order of
  // stage and microbatch, so a rank waits only for what comes before it.
  for (int64_t chunk = 0; chunk < place_.accumulation; ++chunk) {
    take_microbatches(chunk);
    for (int mb = 0; mb < place_.schedule.microbatches; ++mb)
      for (const auto& [s, st] : stages_) {
        if (s > 0 && rank_of(s - 1) != me) act({s, T::recv_f, mb});
        act({s, T::forward, mb});
        if (s < last && rank_of(s + 1) != me) act({s, T::send_f, mb});
        held_.erase({s, mb});  // what a backward would read
      }
    for (InFlight& send : sends_) send.work->wait();
    sends_.clear();
  }
  for (int s : gathered) act({s, T::reshard, 0});
  held_.clear();
  stats_ = kept_stats;
  tracing_ = tracing;
  Tensor sum = Tensor::empty({1}, DType::f64);
  sum.data<double>()[0] = stages_.contains(last) ? static_cast<double>(loss_sum_) : 0.0;
  group_->all_reduce(sum)->wait();
  return static_cast<double>(static_cast<float>(sum.data<double>()[0]));
}

StepRunner::Result PipelineRunner::step(double lr, int64_t adam_step) {
  const int64_t m = place_.schedule.microbatches, chunks = place_.accumulation;
  count_targets();
  loss_sum_ = 0;
  aux_loss_sum_ = 0;
  for (auto& [s, st] : stages_) {
    st->backwards_done = 0;
    st->expert_load.clear();
  }
  stats_ = {};
  trace_.clear();
  const auto start = step_start_ = std::chrono::steady_clock::now();
  // With gradient accumulation the schedule runs once per chunk of m microbatches (chunk c's microbatch k is the
  // step's microbatch c m + k), the gradients summed on over the chunks and reduced after the last.
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    take_microbatches(chunk);
    using T = parallel::PpActionType;
    const std::vector<parallel::PpAction>& actions = place_.schedule.actions.at(static_cast<size_t>(group_->rank()));
    for (size_t i = 0; i < actions.size(); ++i) {
      const parallel::PpAction& a = actions[i];
      // Between runs a stage the next run gathers first stays gathered (its RESHARD after the run's last compute
      // waits, its UNSHARD finds it held); gradients are reduced once, after the last run.
      if ((a.type == T::unshard && local_stage(a.stage).unsharded) ||
          (a.type == T::reduce_grad && chunk + 1 < chunks) ||
          (a.type == T::reshard && chunk + 1 < chunks && i > last_compute_ && kept_between_runs_.contains(a.stage)))
        continue;
      const double begin = tracing_ ? since_start_us() : 0;
      waited_until_us_ = begin;
      act(a);
      note_held();
      const bool issue_only = a.type == T::send_f || a.type == T::send_b || a.type == T::recv_f || a.type == T::recv_b;
      if (tracing_ && !issue_only && a.type != T::reshard)
        trace_.push_back({parallel::to_string(a), !parallel::is_compute(a.type), waited_until_us_, since_start_us()});
    }
    for (InFlight& send : sends_) send.work->wait();
    sends_.clear();
    for (const auto& [key, values] : held_)
      MT_CHECK(values.empty(), "pipeline rank {}: stage {}, microbatch {} still holds {} values after the step",
               group_->rank(), key.first, key.second, values.size());
    held_.clear();
    MT_CHECK(receives_f_.empty() && receives_b_.empty(), "pipeline rank {}: a receive was never used", group_->rank());
  }
  for (const auto& [s, st] : stages_)
    MT_CHECK(st->step_held.empty(), "pipeline rank {}: stage {}'s gathered weights left after the step (no RESHARD)",
             group_->rank(), s);
  stats_.step_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  for (const auto& [s, st] : stages_)
    MT_CHECK(st->backwards_done == m * chunks, "pipeline stage {} ran the backward of {} of {} microbatches", s,
             st->backwards_done, m * chunks);

  // The loss (from the last stage's rank) and every rank's sum of squares, summed over the pipeline.
  const double update_begin = tracing_ ? since_start_us() : 0;
  squares_run_->run();
  Tensor sums = Tensor::empty({3}, DType::f64);
  const bool last = stages_.contains(place_.schedule.stages() - 1);
  sums.data<double>()[0] = squares_run_->fetch(update_.squares.outputs()[0]).get(0);
  sums.data<double>()[1] = last ? static_cast<double>(loss_sum_) : 0.0;
  sums.data<double>()[2] = last ? aux_loss_sum_ : 0.0;
  group_->all_reduce(sums)->wait();
  squares_.data<double>()[0] = sums.data<double>()[0];
  lr_.data<double>()[0] = lr;
  adam_step_.data<int64_t>()[0] = adam_step;
  update_run_->run();
  if (tracing_) trace_.push_back({"norm and update", false, update_begin, since_start_us()});
  std::optional<double> aux_loss;  // the microbatches' mean, as a single rank's step reports it
  if (config_.model.has_load_balancing_loss()) aux_loss = sums.data<double>()[2] / static_cast<double>(m * chunks);
  return {.loss = static_cast<double>(static_cast<float>(sums.data<double>()[1])),
          .grad_norm = update_run_->fetch(update_.norm).get(0),
          .expert_load = step_expert_load(),
          .aux_loss = aux_loss};
}

void PipelineRunner::add_expert_load(Stage& st, int mb) {
  std::map<graph::ValueId, Tensor>& values = held_[{st.programs.index, mb}];
  st.expert_load.resize(st.programs.expert_load.size());
  for (size_t l = 0; l < st.programs.expert_load.size(); ++l) {
    const auto it = values.find(st.programs.expert_load[l]);
    MT_ASSERT(it != values.end(), "pipeline stage {}: its forward left no expert load", st.programs.index);
    std::vector<double>& sum = st.expert_load[l];
    sum.resize(static_cast<size_t>(it->second.numel()));
    for (size_t e = 0; e < sum.size(); ++e) sum[e] += it->second.get(static_cast<int64_t>(e));
    values.erase(it);
  }
}

std::vector<std::vector<double>> PipelineRunner::step_expert_load() {
  const models::LlamaConfig& model = config_.model;
  const int64_t layers = model.moe_layers(), slots = model.n_experts + 1;  // per expert, then the dropped
  if (layers == 0) return {};
  Tensor all = Tensor::zeros({layers, slots}, DType::f64);
  for (const auto& [s, st] : stages_) {
    const int64_t first = std::max(st->programs.span.first_layer, model.first_dense_layers) - model.first_dense_layers;
    for (size_t l = 0; l < st->expert_load.size(); ++l)
      for (int64_t e = 0; e < slots; ++e)
        all.data<double>()[(first + static_cast<int64_t>(l)) * slots + e] = st->expert_load[l][static_cast<size_t>(e)];
  }
  // Each stage's ranks hold their layers' sums whole (the stage summed them over its ranks): one rank of each
  // stage, this rank's pipeline, adds them up.
  group_->all_reduce(all)->wait();
  std::vector<std::vector<double>> out(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l)
    out[static_cast<size_t>(l)].assign(all.data<double>().begin() + l * slots,
                                       all.data<double>().begin() + (l + 1) * slots);
  return out;
}

double PipelineRunner::since_start_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - step_start_).count();
}

int PipelineRunner::first_rank_holding(const std::string& name) const {
  for (size_t s = 0; s < place_.spans.size(); ++s)
    if (models::span_holds(config_.model, place_.spans[s], name))
      return place_.schedule.rank_of_stage[s] * place_.stage_size;
  throw InvalidArgument(fmt::format("no pipeline stage holds parameter '{}'", name));
}

sharding::Layout PipelineRunner::mesh_layout(const std::string& name) const {
  sharding::Layout stage = sharding::Layout::from_placements(std::vector<sharding::Placement>(3));
  if (place_.stage_mesh)
    for (const auto& [s, st] : stages_)
      if (const auto it = st->programs.parameter_layouts.find(name); it != st->programs.parameter_layouts.end())
        stage = it->second;
  sharding::Layout out = stage;
  out.placements.insert(out.placements.begin(), sharding::Placement::replicate());
  out.order.insert(out.order.begin(), -1);
  return out;
}

Tensor PipelineRunner::gather_parameter(const std::string& name) {
  const Tensor& local = params_.at(name);
  if (!place_.stage_mesh) return local;
  for (const auto& [s, st] : stages_) {
    const auto it = st->programs.parameter_layouts.find(name);
    if (it == st->programs.parameter_layouts.end()) continue;
    const sharding::Layout replicated = sharding::Layout::from_placements(
        std::vector<sharding::Placement>(static_cast<size_t>(place_.stage_mesh->ndim())));
    return sharding::redistribute(local, models::llama_parameters(config_.model).at(name).shape, it->second, replicated,
                                  *stage_groups_, *stage_planner_);
  }
  throw InvalidArgument(fmt::format("pipeline rank {} holds no parameter '{}'", group_->rank(), name));
}

std::string PipelineRunner::text() const {
  std::vector<const compile::PipelineStage*> stages;
  for (const auto& [s, st] : stages_) stages.push_back(&st->programs);
  return compile::pipeline_programs_text(place_, stages);
}

double PipelineRunner::flops_per_step() const {
  double total = update_run_->flops();
  const auto m = static_cast<double>(place_.schedule.microbatches);
  for (const auto& [s, st] : stages_) {
    for (const Program* program : {&st->forward, &st->backward, &st->backward_input, &st->backward_weight})
      if (program->executor) total += m * program->executor->flops();
    if (st->unshard.executor) total += st->unshard.executor->flops();
  }
  return total;
}

int64_t PipelineRunner::p2p_per_step() const {
  int64_t n = 0;
  using T = parallel::PpActionType;
  for (const parallel::PpAction& a : place_.schedule.actions.at(static_cast<size_t>(group_->rank()))) {
    const compile::PipelineStage& p = stages_.at(a.stage)->programs;
    if (a.type == T::send_f) n += static_cast<int64_t>(p.to_next().size());
    if (a.type == T::send_b) n += static_cast<int64_t>(p.to_previous().size());
    if (a.type == T::recv_f) n += static_cast<int64_t>(p.from_previous().size());
    if (a.type == T::recv_b) n += static_cast<int64_t>(p.from_next().size());
  }
  return n;
}

double PipelineRunner::p2p_bytes_per_step() const {
  double bytes = 0;
  for (const parallel::PpAction& a : place_.schedule.actions.at(static_cast<size_t>(group_->rank()))) {
    if (a.type != parallel::PpActionType::send_f && a.type != parallel::PpActionType::send_b) continue;
    const compile::PipelineStage& p = stages_.at(a.stage)->programs;
    for (const graph::ValueId v : a.type == parallel::PpActionType::send_f ? p.to_next() : p.to_previous()) {
      const graph::ValueInfo& info = p.joint.value(v).info;
      bytes += static_cast<double>(info.shape.numel()) * static_cast<double>(dtype_size(info.dtype));
    }
  }
  return bytes;
}

void PipelineRunner::set_profiling(bool on) {
  for (auto& [s, st] : stages_)
    for (Program* program : {&st->forward, &st->backward, &st->backward_input, &st->backward_weight, &st->unshard})
      if (program->executor) program->executor->set_profiling(on);
  update_run_->set_profiling(on);
}

std::vector<runtime::Executor::OpTime> PipelineRunner::profile() const {
  std::map<std::string, runtime::Executor::OpTime> by_op;
  auto add = [&](const runtime::Executor& ex) {
    for (const auto& t : ex.profile()) {
      auto& sum = by_op[t.op];
      sum.op = t.op;
      sum.calls += t.calls;
      sum.seconds += t.seconds;
      sum.flops += t.flops;
      sum.bytes += t.bytes;
    }
  };
  for (const auto& [s, st] : stages_)
    for (const Program* program :
         {&st->forward, &st->backward, &st->backward_input, &st->backward_weight, &st->unshard})
      if (program->executor) add(*program->executor);
  add(*update_run_);
  std::vector<runtime::Executor::OpTime> out;
  for (auto& [op, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.seconds > y.seconds; });
  return out;
}

std::vector<checkpoint::HeldTensor> PipelineRunner::held_tensors() const {
  const auto specs = models::llama_parameters(config_.model);
  const int pp = pipeline_rank();
  std::vector<checkpoint::HeldTensor> held;
  for (const auto& [name, local] : params_) {
    const Shape& shape = specs.at(name).shape;
    const sharding::Layout layout = mesh_layout(name);
    held.push_back({name, shape, layout, local, pp});
    held.push_back({"optimizer.exp_avg." + name, shape, layout, exp_avg_.at(name), pp});
    held.push_back({"optimizer.exp_avg_sq." + name, shape, layout, exp_avg_sq_.at(name), pp});
  }
  return held;
}

checkpoint::CheckpointRank PipelineRunner::checkpoint_rank() const {
  return {&place_.mesh, place_.mesh.coordinate(world_->rank()), world_.get()};
}

std::map<std::string, Tensor> PipelineRunner::whole_parameters() {
  std::map<std::string, Tensor> whole;
  for (const auto& [name, spec] : models::llama_parameters(config_.model)) {
    const int owner = first_rank_holding(name);
    Tensor t = params_.contains(name) ? gather_parameter(name) : Tensor::empty(spec.shape, DType::f32);
    world_->broadcast(t, owner)->wait();
    if (world_->rank() == 0) whole[name] = t;
  }
  return whole;
}

std::string PipelineRunner::layout_summary() const {
  const parallel::PpSchedule& s = place_.schedule;
  std::vector<std::string> stages;
  for (const models::LlamaSpan& span : place_.spans) {
    std::vector<std::string> parts;
    if (span.embedding) parts.push_back("embedding");
    if (span.end_layer == span.first_layer + 1) parts.push_back(fmt::format("layer {}", span.first_layer));
    if (span.end_layer > span.first_layer + 1)
      parts.push_back(fmt::format("layers {}-{}", span.first_layer, span.end_layer - 1));
    if (span.head) parts.push_back("head");
    stages.push_back(fmt::format("{}", fmt::join(parts, "+")));
  }
  return fmt::format("mesh {}: pipeline {} of {} stages ({} per rank), {} microbatches; stages: {}",
                     place_.mesh.describe(), parallel::pp_schedule_name(s.kind), s.stages(), s.stages_per_rank,
                     s.microbatches, fmt::join(stages, "; "));
}

void PipelineRunner::report(RankReport& r) const {
  r.coordinate = place_.mesh.coordinate(world_->rank());
  for (const auto& [name, p] : params_) {
    r.parameter_bytes += static_cast<double>(p.nbytes());
    r.gradient_bytes += static_cast<double>(p.nbytes());
    r.optimizer_state_bytes += static_cast<double>(exp_avg_.at(name).nbytes() + exp_avg_sq_.at(name).nbytes());
  }
  r.collectives_per_step = static_cast<double>(p2p_per_step()) + 1;  // and the loss and norm all_reduce
  r.collective_bytes_per_step = p2p_bytes_per_step() + 16;
  r.pipeline_bubble = stats_.bubble();
  r.activation_peak_bytes = stats_.held_bytes_peak;
  r.activation_peak_pairs = stats_.held_pairs_peak;
}

std::string PipelineRunner::trace_events(int rank) const { return sched::chrome_trace_events(trace_, rank); }

}  // namespace meshtrain::train
