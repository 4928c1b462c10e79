// Activation checkpointing: the activations of each transformer block that
// backward reads are recomputed in backward, just before the first node
// that reads them, instead of held from forward to backward. A transform of
// the training step's graph before it is laid out and scheduled, so the
// estimators see its cost (the recomputed nodes) and its memory (what no
// longer lives across the step), and the lowering shards the recomputation
// like the rest. The recomputed nodes are the forward's own ops on the same
// inputs: every result is bitwise the same.
#pragma once

#include <optional>
#include <string_view>

#include "graph/graph.h"

namespace meshtrain::sched {

enum class ActivationCheckpoint {
  none,
  full,       // a block keeps its input alone; all of its forward is recomputed
  selective,  // it also keeps its attention's and matmuls' outputs (all, or every other: SelectiveMatmuls);
              // the cheap ops between them (and the matmuls not kept) are recomputed
};
std::string_view activation_checkpoint_name(ActivationCheckpoint mode);

// Under selective, the matmuls whose outputs a block keeps: all, or every
// other one (the 1st, 3rd, ... of each pass through a block, the others
// recomputed with the cheap ops: torchtitan's "op" policy, which saves "all
// compute intensive ops except every second mm").
enum class SelectiveMatmuls { all, every_other };
std::string_view selective_matmuls_name(SelectiveMatmuls matmuls);

// Blocks are the forward nodes of each scope "layers.<i>" (and its
// sub-scopes) that run one after another (each microbatch's pass through a
// block is its own). A block always keeps what later forward nodes read
// (its output, the next block's input) and what is computed from
// parameters alone (a parameter cast to the compute dtype). Returns whether the
// graph changed.
bool checkpoint_activations(graph::Graph& g, ActivationCheckpoint mode,
                            SelectiveMatmuls matmuls = SelectiveMatmuls::all);

}  // namespace meshtrain::sched
