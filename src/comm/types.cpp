#include "comm/types.h"

#include <fmt/ranges.h>

#include "core/error.h"

namespace meshtrain::comm {

namespace {
constexpr std::string_view kReduceNames[] = {"sum", "avg", "max", "min"};
constexpr std::string_view kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                         "broadcast",  "barrier",    "send",           "recv"};
}  // namespace

std::string_view reduce_op_name(ReduceOp op) { return kReduceNames[static_cast<int>(op)]; }

ReduceOp parse_reduce_op(std::string_view name) {
  for (int i = 0; i < 4; ++i)
    if (kReduceNames[i] == name) return static_cast<ReduceOp>(i);
  throw InvalidArgument(fmt::format("unknown reduce op '{}': expected sum, avg, max or min", name));
}

std::string_view op_type_name(OpType op) { return kOpNames[static_cast<int>(op)]; }

OpType parse_op_type(std::string_view name) {
  for (int i = 0; i < 8; ++i)
    if (kOpNames[i] == name) return static_cast<OpType>(i);
  throw InvalidArgument(fmt::format("unknown collective '{}' (the collectives: {})", name, fmt::join(kOpNames, ", ")));
}

bool is_p2p(OpType op) { return op == OpType::send || op == OpType::recv; }

}  // namespace meshtrain::comm
