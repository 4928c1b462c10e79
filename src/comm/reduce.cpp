#include "comm/reduce.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace meshtrain::comm {

namespace {

template <typename Acc>
Acc combine(ReduceOp op, Acc a, Acc b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::min:
      return std::min(a, b);
  }
  return a;
}

// Direct loops for the types that have C++ arithmetic; everything else goes
// through the exact per-element load/store of core/dtype.
template <typename T, typename Acc>
void reduce_native(ReduceOp op, const void* const* rows, int n, void* out, size_t count) {
  auto* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    Acc acc = static_cast<Acc>(static_cast<const T*>(rows[0])[i]);
    for (int k = 1; k < n; ++k) acc = combine<Acc>(op, acc, static_cast<const T*>(rows[k])[i]);
    if (op == ReduceOp::avg) acc = acc / static_cast<Acc>(n);
    o[i] = static_cast<T>(acc);
  }
}

// f32, one row at a time so the inner loops vectorize; each element still
// accumulates in row order 0, 1, ..., n-1.
void reduce_f32(ReduceOp op, const void* const* rows, int n, void* out, size_t count) {
  auto* o = static_cast<float*>(out);
  if (o != rows[0]) std::memcpy(o, rows[0], count * sizeof(float));
  for (int k = 1; k < n; ++k) {
    const auto* r = static_cast<const float*>(rows[k]);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        for (size_t i = 0; i < count; ++i) o[i] += r[i];
        break;
      case ReduceOp::max:
        for (size_t i = 0; i < count; ++i) o[i] = std::max(o[i], r[i]);
        break;
      case ReduceOp::min:
        for (size_t i = 0; i < count; ++i) o[i] = std::min(o[i], r[i]);
        break;
    }
  }
  if (op == ReduceOp::avg)
    for (size_t i = 0; i < count; ++i) o[i] /= static_cast<float>(n);
}

void reduce_bf16(ReduceOp op, const void* const* rows, int n, void* out, size_t count) {
  auto* o = static_cast<bfloat16*>(out);
  for (size_t i = 0; i < count; ++i) {
    float acc = bf16_to_f32(static_cast<const bfloat16*>(rows[0])[i]);
    for (int k = 1; k < n; ++k) acc = combine<float>(op, acc, bf16_to_f32(static_cast<const bfloat16*>(rows[k])[i]));
    if (op == ReduceOp::avg) acc /= static_cast<float>(n);
    o[i] = f32_to_bf16(acc);
  }
}

void reduce_generic_float(DType dtype, ReduceOp op, const void* const* rows, int n, void* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    auto acc = static_cast<float>(load_as_double(rows[0], dtype, i));
    for (int k = 1; k < n; ++k) acc = combine<float>(op, acc, static_cast<float>(load_as_double(rows[k], dtype, i)));
    if (op == ReduceOp::avg) acc /= static_cast<float>(n);
    store_from_double(out, dtype, i, acc);
  }
}

}  // namespace

void reduce_rows(DType dtype, ReduceOp op, const void* const* rows, int n, void* out, size_t count) {
  // The backends call this with one row per rank of a group, for ops that
  // ProcessGroup accepted (it refuses avg of an integer dtype when issued).
  MT_ASSERT(n >= 1, "reduce_rows needs at least one row, got {}", n);
  MT_ASSERT(!(op == ReduceOp::avg && !is_floating(dtype)), "reduce op avg reached reduce_rows with integer dtype {}",
            dtype_name(dtype));
  if (count == 0) return;  // empty blocks of uneven splits may have null buffers
  switch (dtype) {
    case DType::f32:
      return reduce_f32(op, rows, n, out, count);
    case DType::i32:
      return reduce_native<int32_t, int64_t>(op, rows, n, out, count);
    case DType::i64:
      return reduce_native<int64_t, int64_t>(op, rows, n, out, count);
    case DType::f64:
      return reduce_native<double, double>(op, rows, n, out, count);
    case DType::bf16:
      return reduce_bf16(op, rows, n, out, count);
    default:
      return reduce_generic_float(dtype, op, rows, n, out, count);
  }
}

bool needs_host_reduction(DType dtype) {
  return dtype != DType::f32 && dtype != DType::f64 && dtype != DType::i32 && dtype != DType::i64;
}

std::vector<int64_t> torch_chunk_sizes(int64_t total, int n) {
  MT_CHECK(n > 0 && total >= 0, "torch_chunk_sizes({}, {}): need n > 0 and total >= 0", total, n);
  const int64_t chunk = (total + n - 1) / n;
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) sizes[static_cast<size_t>(r)] = std::clamp<int64_t>(total - chunk * r, 0, chunk);
  return sizes;
}

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size(), 0);
  if (!counts.empty()) std::exclusive_scan(counts.begin(), counts.end(), d.begin(), int64_t{0});
  return d;
}

}  // namespace meshtrain::comm
