// A node's attributes, read and written through typed keys: each key (in
// namespace attr below) names one attribute and fixes its C++ type, so a use
// can neither misspell the name nor read it as the wrong type.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace meshtrain::graph {

template <typename T>
struct AttrKey;

// One attribute: a key's name and its value (the result of `key(value)`).
struct Attr {
  using Value = std::variant<bool, int64_t, double, std::vector<int64_t>, DType, std::string>;
  std::string_view name;
  Value value;
};

template <typename T>
struct AttrKey {
  std::string_view name;
  Attr operator()(T value) const { return {name, Attr::Value(std::move(value))}; }
};

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<Attr> attrs) {
    for (const Attr& a : attrs) values_.insert_or_assign(std::string(a.name), a.value);
  }
  // The value of `key`; fails naming the key when it is missing.
  template <typename T>
  const T& get(const AttrKey<T>& key) const {
    const auto it = values_.find(key.name);
    if (it == values_.end()) missing(key.name);
    const T* v = std::get_if<T>(&it->second);
    if (v == nullptr) wrong_type(key.name);
    return *v;
  }
  template <typename T>
  T get_or(const AttrKey<T>& key, T fallback) const {
    const auto it = values_.find(key.name);
    if (it == values_.end()) return fallback;
    const T* v = std::get_if<T>(&it->second);
    if (v == nullptr) wrong_type(key.name);
    return *v;
  }
  template <typename T>
  Attrs& set(const AttrKey<T>& key, T value) {
    values_.insert_or_assign(std::string(key.name), Attr::Value(std::move(value)));
    return *this;
  }
  bool has(std::string_view name) const { return values_.find(name) != values_.end(); }
  // "{dim=1, eps=1e-05}" in name order; "" when there are none.
  std::string to_string() const;
  bool operator==(const Attrs&) const = default;

 private:
  [[noreturn]] static void missing(std::string_view name);
  [[noreturn]] void wrong_type(std::string_view name) const;  // two keys of one name with different types
  std::map<std::string, Attr::Value, std::less<>> values_;
};

// Every attribute key of the built-in ops. An op that needs a new attribute
// adds its key here (extensions may declare their own keys anywhere).
namespace attr {
inline constexpr AttrKey<std::vector<int64_t>> shape{"shape"};
inline constexpr AttrKey<DType> dtype{"dtype"};
inline constexpr AttrKey<double> value{"value"};  // full's fill value
inline constexpr AttrKey<double> alpha{"alpha"};  // scale's factor
inline constexpr AttrKey<bool> transpose_a{"transpose_a"}, transpose_b{"transpose_b"};
inline constexpr AttrKey<int64_t> dim{"dim"}, dim0{"dim0"}, dim1{"dim1"};
inline constexpr AttrKey<int64_t> start{"start"}, length{"length"}, full_size{"full_size"};
inline constexpr AttrKey<double> eps{"eps"};
inline constexpr AttrKey<int64_t> ignore_index{"ignore_index"};
inline constexpr AttrKey<int64_t> vocab{"vocab"};
inline constexpr AttrKey<double> theta{"theta"};
inline constexpr AttrKey<bool> inverse{"inverse"};  // rope: rotate by -angle (its backward)
inline constexpr AttrKey<double> scale{"scale"};    // attention's softmax scale
// Context parallelism (graph/sequence_order.h): the sequence stored in
// `seq_chunks` load-balanced chunks (absent or 1: in position order),
// `seq_total` long, of which an operand holds rows from `seq_first` on
// (lowering sets the last two on each rank's node).
inline constexpr AttrKey<int64_t> seq_chunks{"seq_chunks"}, seq_first{"seq_first"}, seq_total{"seq_total"};
// attention's keys as a block of the sequence (a ring step's): the position
// of the first, the rest contiguous after it (absent: the whole sequence).
inline constexpr AttrKey<int64_t> key_first{"key_first"};
// attention's keys and values in its queries' load-balanced order, split as
// they are (context parallelism's ring): lowering runs it as ring steps.
inline constexpr AttrKey<bool> ring{"ring"};
// ring_shift: how many places on the ring its tensor goes (absent: 1, the next rank).
inline constexpr AttrKey<int64_t> ring_distance{"ring_distance"};
// FP8 (graph/ops/matmul.cpp): the format each operand of an fp8_matmul is
// quantised to, and that of its output's gradient (its backward's); scales
// rounded down to powers of two; the linear layer (or the tensor an amax or
// fp8_quantize reads) and each operand's role in it ("input", "weight",
// "output gradient"), which its errors name.
inline constexpr AttrKey<DType> format_a{"format_a"}, format_b{"format_b"}, grad_format{"grad_format"};
inline constexpr AttrKey<bool> pow2_scale{"pow2_scale"};
inline constexpr AttrKey<std::string> tensor{"tensor"}, operand_a{"operand_a"}, operand_b{"operand_b"};
inline constexpr AttrKey<double> max_norm{"max_norm"};
inline constexpr AttrKey<double> beta1{"beta1"}, beta2{"beta2"}, weight_decay{"weight_decay"};
// Mixture of experts (graph/ops/moe.cpp): the experts each token picks, the
// experts there are, and the capacity (0: dropless).
inline constexpr AttrKey<int64_t> top_k{"top_k"}, n_experts{"n_experts"};
inline constexpr AttrKey<double> capacity_factor{"capacity_factor"};
// Expert parallelism: rows dispatched into `expert_blocks` blocks of
// n_experts / expert_blocks experts each (their leading dim); a local
// grouped GEMM's weights start at expert `first_expert`.
inline constexpr AttrKey<int64_t> expert_blocks{"expert_blocks"}, first_expert{"first_expert"};
// Collectives of a lowered (per-rank) graph: the mesh dims they run over,
// this rank's group (global ranks, in group-rank order), the tensor's global
// shape and its layouts before and after, the collective's buffer bytes per
// rank (nccl-tests convention).
inline constexpr AttrKey<std::vector<int64_t>> mesh_dims{"mesh_dims"}, group{"group"}, global_shape{"global_shape"};
inline constexpr AttrKey<std::string> layout_before{"before"}, layout_after{"after"};
inline constexpr AttrKey<double> comm_bytes{"bytes"};
// Elements of a started collective's staging buffer (its second output).
inline constexpr AttrKey<int64_t> buffer_elements{"buffer"};
// A bucket of collectives merged into one: bucket_unpack's members' shapes,
// each as its rank then its dims; and on a bucket's all_gather or
// reduce_scatter, each member's block per rank (elements), as the coalesced
// collective moves them (comm::ProcessGroup::all_gather_coalesced: each
// member whole on the gathered side, so bucket_pack and bucket_unpack only
// ever lay members one after another).
inline constexpr AttrKey<std::vector<int64_t>> member_shapes{"members"};
inline constexpr AttrKey<std::vector<int64_t>> member_blocks{"member_blocks"};
// On bucket_pack and bucket_unpack: the members are copied in and out, never
// laid out in the bucket (absent: the memory plan makes them views of it
// where it can).
inline constexpr AttrKey<bool> copy_members{"copy_members"};
}  // namespace attr

}  // namespace meshtrain::graph
