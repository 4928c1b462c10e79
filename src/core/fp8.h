// Tensorwise FP8 scaling (the current scaling of TransformerEngine and
// torchao): a tensor's scale from its largest magnitude (amax), and one
// element quantised with it onto an FP8 format's grid.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace meshtrain {

// The largest finite value of an FP8 format: 448 (E4M3), 57344 (E5M2).
inline double fp8_max(DType format) {
  MT_ASSERT(format == DType::f8e4m3 || format == DType::f8e5m2, "{} is not an FP8 format", dtype_name(format));
  return format == DType::f8e4m3 ? 448.0 : 57344.0;
}

// The scale that maps magnitudes up to `amax` onto the format's range:
// max / amax in float64, rounded to float32 (as torchao computes it); amax
// is taken as at least 1e-12, so that an all-zero tensor's scale is finite.
// `pow2`: rounded down to a power of two (dividing by it is then exact).
// amax must be finite and >= 0 (the caller names the tensor otherwise).
inline float fp8_scale(DType format, double amax, bool pow2) {
  MT_ASSERT(std::isfinite(amax) && amax >= 0, "fp8_scale of amax {}", amax);
  const auto scale = static_cast<float>(fp8_max(format) / std::max(amax, 1e-12));
  if (!pow2) return scale;
  int exponent = 0;
  std::frexp(scale, &exponent);  // scale = m 2^exponent, m in [0.5, 1)
  return std::ldexp(1.0f, exponent - 1);
}

// The value of the format nearest to y, ties to even, saturating at its
// largest finite value (what converting to the format and back gives, for
// finite y): a few instructions, for the loops that quantise whole tensors.
// The normal range rounds the f32 mantissa to the format's bits in integer
// arithmetic; the subnormal range adds and takes away a number whose f32
// spacing is the format's smallest step, so the FPU's rounding does it.
inline float fp8_round(float y, DType format) {
  const bool e4m3 = format == DType::f8e4m3;
  const int dropped = e4m3 ? 20 : 21;  // 23 mantissa bits less the format's 3 or 2
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float step_magic = e4m3 ? 0x1p14f : 0x1p7f;  // f32 spacing 2^-9 / 2^-16: the subnormal step
  const float largest = e4m3 ? 448.0f : 57344.0f;
  const float a = std::fabs(y);
  float r;
  if (a < min_normal) {
    r = (a + step_magic) - step_magic;  // two IEEE roundings (nothing here builds with -ffast-math)
  } else {
    const uint32_t u = std::bit_cast<uint32_t>(a);
    const uint32_t half = (1u << (dropped - 1)) - 1 + ((u >> dropped) & 1u);
    r = std::bit_cast<float>((u + half) & ~((1u << dropped) - 1));
  }
  return std::copysign(std::min(r, largest), y);
}

// x * scale rounded as fp8_round does, as the format's bits (core/dtype.h's
// conversions); and those bits as a value.
inline uint8_t fp8_quantize(float x, float scale, DType format) {
  return format == DType::f8e4m3 ? f32_to_e4m3(x * scale) : f32_to_e5m2(x * scale);
}
inline float fp8_widen(uint8_t bits, DType format) {
  return format == DType::f8e4m3 ? e4m3_to_f32(bits) : e5m2_to_f32(bits);
}

}  // namespace meshtrain
