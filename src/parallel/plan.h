// Parallel plans: they only assign layouts. Given the degrees of data
// parallelism, a plan builds the device mesh (dp_replicate, dp_shard, tp;
// row-major, tp innermost) and says how each parameter, optimizer state and
// batch input of a training step lies on it, and in which layout each step
// output is delivered. Sharding propagation and lowering (spmd/) derive the
// collectives.
#pragma once

#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "parallel/pipeline_schedule.h"
#include "sharding/device_mesh.h"
#include "sharding/layout.h"

namespace meshtrain::parallel {

// The [parallel] config section.
struct ParallelConfig {
  int64_t dp_replicate = 1;  // DDP: parameters replicated, gradients reduced
  int64_t dp_shard = -1;     // FSDP / ZeRO-3: parameters, gradients and states Shard(0); -1: the ranks left over
  int64_t tp = 1;            // Megatron tensor parallel: weights split by output or input features
  // Expert parallelism: each MoE layer's experts split over `ep` of the
  // dp_shard ranks (ep divides dp_shard), or with cp over every cp rank and
  // ep / cp of the dp_shard ranks; FSDP then shards the experts over the
  // rest of dp_shard; tokens go to their experts' ranks and back by all_to_all.
  int64_t ep = 1;
  int64_t expert_tp = 1;  // 1 or tp: the routed experts also split Megatron-style over tp
  // Context parallelism: every activation split on the sequence over `cp`
  // ranks (load-balanced chunks, graph/sequence_order.h); the weights
  // FSDP-sharded over dp_shard x cp. Attention all-gathers the keys and
  // values over cp, or passes them around the cp ring (spmd/ring_attention.h),
  // or (by_estimate, "auto") whichever the step's estimate says is faster
  // (compile::choose_cp_attention).
  int64_t cp = 1;
  enum class CpAttention { allgather, ring, by_estimate } cp_attention = CpAttention::by_estimate;
  bool sequence_parallel = false;
  // Sequence parallelism's all_gathers and reduce_scatters over tp cut into
  // point-to-point steps under their GEMMs (sched/passes/async_tp.h).
  bool async_tp = false;
  bool loss_parallel = false;
  bool reshard_after_forward = true;  // false: keep gathered weights from forward to backward (spmd::LowerOptions)
  // Pipeline parallelism (compile/pipeline_stage.h): the model cut into
  // pp x pp_stages_per_rank stages at block boundaries, run by pp_schedule
  // over pp_microbatches microbatches a step.
  int64_t pp = 1;
  PpScheduleKind pp_schedule = PpScheduleKind::one_f_one_b;
  int64_t pp_microbatches = 0;     // 0: as many as there are stages
  int64_t pp_stages_per_rank = 0;  // 0: 2 for interleaved_1f1b and zbv, else 1
  // With FSDP: at most this many of a rank's stages gathered at once (0: all
  // of them, from the step's start to its end); see add_pp_fsdp_actions.
  int64_t pp_max_active_stages = 0;
  // A stage also gathers, once a step with its forward's, its weights in
  // the other layouts its backward reads (held all step: more memory, no
  // gathers per microbatch); false: its backward gathers those itself.
  bool pp_keep_backward_layouts = false;
  // Per stage, its share of the model's n_layers + 2 units (the embedding
  // and the head count as one each); empty: as even as can be.
  std::vector<int64_t> pp_layers_per_stage;
  // A schedule of one's own (parallel::pp_schedule_from_csv): its compute
  // actions per rank, from which its stages and microbatches are taken;
  // "": pp_schedule's.
  std::string pp_schedule_csv;
  int64_t stages_per_rank() const {
    if (pp_stages_per_rank > 0) return pp_stages_per_rank;
    return pp_schedule == PpScheduleKind::interleaved_1f1b || pp_schedule == PpScheduleKind::zbv ? 2 : 1;
  }
  int64_t microbatches() const { return pp_microbatches > 0 ? pp_microbatches : pp * stages_per_rank(); }
};

// The mesh (dp_replicate, dp_shard, tp) for `world_size` ranks; with cp > 1
// (dp_replicate, dp_shard, cp, tp); with ep > 1 (dp_replicate, dp_shard,
// ep, tp), its dp_shard dim then dp_shard / ep ranks; with both
// (dp_replicate, dp_shard, ep, cp, tp), or, where ep does not divide
// dp_shard but is cp times a divisor of it, (dp_replicate, dp_shard,
// dp_shard_in_ep, cp, tp): ep's ranks every cp rank and dp_shard_in_ep =
// ep / cp of dp_shard's, as torchtitan's. Throws naming the [parallel] key
// when the degrees do not multiply to the world size or ep fits neither way.
sharding::DeviceMesh make_mesh(const ParallelConfig& config, int world_size);
// The mesh dims that split the batch (dp_replicate, dp_shard and ep, or
// dp_shard_in_ep), and how many ranks they hold together.
std::vector<int> data_parallel_dims(const sharding::DeviceMesh& mesh);
// The mesh dims the routed experts split over by expert, outer first: ep;
// or, where ep takes every cp rank, dp_shard_in_ep then cp. Empty without
// expert parallelism.
std::vector<int> expert_dims(const sharding::DeviceMesh& mesh);
int64_t data_parallel_degree(const sharding::DeviceMesh& mesh);
// Whether the mesh splits activations besides the batch (tp or cp over one
// rank): their layouts are then pinned (StepRoles::residual_stream, ...).
bool splits_activations(const sharding::DeviceMesh& mesh);

// The values of a training step a plan lays out.
struct StepRoles {
  std::vector<graph::ValueId> parameters;
  std::vector<std::pair<graph::ValueId, graph::ValueId>> states;  // optimizer state -> its parameter
  std::vector<graph::ValueId> batch_inputs;                       // [batch, ...]: split over data parallel
  std::vector<graph::ValueId> replicated_outputs;                 // loss, gradient norm
  std::vector<std::pair<graph::ValueId, graph::ValueId>>
      updates;                            // updated value -> the parameter or state it replaces
  std::map<graph::ValueId, int> tp_dims;  // parameter -> the tensor dim tp splits (absent: replicated over tp)
  // The routed experts' parameters [n_experts, ...]: under ep split by
  // expert over ep, and over the rest of dp_shard by dim 1 (FSDP).
  std::vector<graph::ValueId> experts;
  // Values laid out by block of experts (dim 0) over ep, the batch their
  // dim 1: an MoE layer's rows dispatched to the experts and back, and
  // their experts (graph/ops/moe.cpp's moe_dispatch).
  std::vector<graph::ValueId> dispatched;
  std::vector<graph::ValueId> residual_stream;  // [batch, seq, dim] values between blocks
  std::vector<graph::ValueId> block_inputs;     // [batch, seq, dim] normed values a tp block starts from
  std::vector<graph::ValueId> logits;           // [batch * seq, vocab]: what the loss reads
  // Under context parallelism: attention's keys and values [batch, seq, kv
  // heads, head dim] in position order, whole on every cp rank (all-gathered),
  // their gradients partial sums there.
  std::vector<graph::ValueId> attention_keys;
  std::map<graph::ValueId, graph::ValueId> gradient_of;          // forward value -> its gradient
  std::map<graph::ValueId, graph::ValueId> applied_gradient_of;  // parameter -> the (clipped) gradient its update reads
  // (compute-dtype copy, parameter): each copy lies like its parameter (the
  // cast runs on the parameter's shard, and FSDP gathers the copy).
  std::vector<std::pair<graph::ValueId, graph::ValueId>> copies;
  // The copies' gradients are reduced across data parallel in the compute
  // dtype (bf16), before they are widened; false: widened, then reduced.
  bool reduce_copies_in_compute_dtype = false;
};

struct StepLayouts {
  std::map<graph::ValueId, sharding::Layout> given;    // inputs and parameters
  std::map<graph::ValueId, sharding::Layout> deliver;  // outputs
};

// The layouts of a training step on the mesh (dp_replicate, dp_shard, tp):
// the batch Shard(0) over dp_replicate and dp_shard (DDP, FSDP, HSDP) and
// Replicate over tp; each parameter and its states Replicate over
// dp_replicate, Shard(0) over dp_shard and Shard(tp_dims[p]) over tp. Where
// dp_shard and tp both split dim 0, tp splits first and FSDP shards each tp
// rank's part (so gathering over dp_shard gives that part whole, as
// torchtitan's strided shards do). Over tp (Megatron), each block's input is
// pinned Replicate (every rank starts from the whole activations, as
// torchtitan's PrepareModuleInput asks) and the residual stream Replicate
// (each block ends in one all_reduce) or, with `sequence_parallel`,
// Shard(1) (the norms and residual adds on a part of the sequence;
// all_gather before a block, reduce_scatter after); over dp both lie like
// the batch. With `loss_parallel` the logits are pinned split by vocabulary
// over tp (no rank holds a row's whole vocabulary). Their gradients are
// pinned alike, but a block input's as the residual stream (the backward
// all_reduce, or reduce_scatter under sequence parallelism). A parameter's
// gradient is pinned to the parameter's layout (reduced once, where the
// norm, clipping and AdamW read it), and so is the clipped gradient AdamW
// reads (never gathered for the update). A compute-dtype copy lies like its
// parameter; its gradient is pinned to the parameter's layout too when
// reduce_copies_in_compute_dtype (reduced in bf16, then widened), else as a
// pending sum over data parallel (widened, then reduced in f32). Replicated
// outputs Replicate; updates delivered as what they replace. On the mesh
// with ep, the batch is split over ep too and dense weights FSDP-sharded
// over dp_shard and ep; the experts and the dispatched rows lie by expert
// over ep (StepRoles::experts, dispatched), their gradients reduced over
// the other data-parallel dims only. On the mesh with cp, the weights are
// FSDP-sharded over dp_shard and cp, the batch inputs whole over cp, the
// residual stream and block inputs split on the sequence (dim 1) there,
// and attention's keys and values whole (StepRoles::attention_keys), their
// gradients partial sums.
StepLayouts step_layouts(const sharding::DeviceMesh& mesh, const graph::Graph& g, const StepRoles& roles,
                         const ParallelConfig& config = {});

// Megatron's split of a Hugging Face Llama parameter, by name: the tensor
// dim tp splits. q/k/v/gate/up by output features (dim 0 of the [out, in]
// weight) and o/down by input features (dim 1), so that attention heads and
// MLP columns stay local and each block ends in one partial sum; the
// embedding and lm_head tables by vocabulary rows (dim 0); a mixture of
// experts' shared experts as the MLP (w1, w3 by output, w2 by input). Norm
// scales, the router and the routed experts: none (replicated).
// With `expert_tp`, the routed experts ([n_experts, out, in] each) split
// alike: w1 and w3 by output (dim 1), w2 by input (dim 2).
std::optional<int> llama_tp_dim(std::string_view name, bool expert_tp = false);
// Whether the parameter of this name holds routed experts (split over ep).
bool llama_is_experts(std::string_view name);
// The pending sum over data parallel a parameter's gradient is before it is
// reduced into `kept`, its parameter's layout: Partial over dp_replicate,
// dp_shard and (unless the parameter is split by expert there) ep.
sharding::Layout pending_over_data_parallel(const sharding::DeviceMesh& mesh, const sharding::Layout& kept,
                                            bool experts);

}  // namespace meshtrain::parallel
