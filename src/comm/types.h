// Vocabulary of the communication layer: reduce ops and operation kinds.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain::comm {

enum class ReduceOp : uint8_t { sum, avg, max, min };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

enum class OpType : uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier, send, recv };

std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);
std::string_view op_type_name(OpType op);
OpType parse_op_type(std::string_view name);
bool is_p2p(OpType op);

}  // namespace meshtrain::comm
