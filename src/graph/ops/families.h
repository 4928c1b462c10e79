// The built-in op families, one file each under graph/ops/; the registry
// (graph/op_registry.cpp) collects them on first use.
#pragma once

#include <vector>

#include "graph/op_registry.h"

namespace meshtrain::graph::ops {

void add_elementwise_ops(
    std::vector<OpDef>& ops);  // full, cast, add, mul, scale, scale_by, broadcast_scalar, sqrt, silu, swiglu
void add_matmul_ops(std::vector<OpDef>& ops);      // matmul, rows_matmul, fp8_matmul, fp8_rows_matmul
void add_reduction_ops(std::vector<OpDef>& ops);   // sum, sum_squares, mean, amax, softmax, rms_norm
void add_shape_ops(std::vector<OpDef>& ops);       // reshape (a view), transpose, slice, concat
void add_embedding_ops(std::vector<OpDef>& ops);   // embedding
void add_loss_ops(std::vector<OpDef>& ops);        // count_valid, cross_entropy
void add_attention_ops(std::vector<OpDef>& ops);   // rope, attention
void add_optimizer_ops(std::vector<OpDef>& ops);   // clip_coefficient, adamw
void add_moe_ops(std::vector<OpDef>& ops);         // routing, permutation, grouped_matmul, the aux loss
void add_collective_ops(std::vector<OpDef>& ops);  // all_gather, reduce_scatter, all_reduce, all_to_all, shard_locally,
                                                   // bucket_pack, bucket_unpack, wait

}  // namespace meshtrain::graph::ops
