// Helpers for the op definitions under graph/ops/ (not a public API): dtype
// and shape checks, and the common FLOP rules.
#pragma once

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"

namespace meshtrain::graph::ops {

inline void check_float(const ValueInfo& v, const char* what) {
  MT_CHECK(v.dtype == DType::f32 || v.dtype == DType::f64 || v.dtype == DType::bf16,
           "{} must be f32, f64 or bf16, got {}", what, dtype_name(v.dtype));
}

inline void check_same(const ValueInfo& a, const ValueInfo& b) {
  MT_CHECK(a.dtype == b.dtype, "dtypes differ: {} and {}", dtype_name(a.dtype), dtype_name(b.dtype));
  MT_CHECK(a.shape == b.shape, "shapes differ: {} and {}", a.shape.to_string(), b.shape.to_string());
}

// The dtype a kernel accumulates in (kernels::cpu::Acc): f32 for bf16, else the dtype itself.
inline DType accumulator_dtype(DType t) { return t == DType::bf16 ? DType::f32 : t; }

inline double numel(const ValueInfo& v) { return static_cast<double>(v.shape.numel()); }
inline double bytes_of(const ValueInfo& v) { return numel(v) * static_cast<double>(dtype_size(v.dtype)); }

inline auto elementwise_flops(double per_element) {
  return [per_element](const ValueInfos&, const ValueInfos& out, const Attrs&) { return per_element * numel(out[0]); };
}

}  // namespace meshtrain::graph::ops
