// Element types and exact conversions between them (round-to-nearest-even;
// fp8 saturating to the largest finite value, as the OCP FP8 spec's SAT mode).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

enum class DType : uint8_t { f32, bf16, f16, f8e4m3, f8e5m2, i32, i64, f64 };

inline constexpr DType kAllDTypes[] = {DType::f32,    DType::bf16, DType::f16, DType::f8e4m3,
                                       DType::f8e5m2, DType::i32,  DType::i64, DType::f64};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Accepts the short names (f32, bf16, ...) and the PyTorch names (float32, bfloat16, ...).
DType parse_dtype(std::string_view name);
bool is_floating(DType t);

// The C++ element type of a bf16 tensor (kernels compute on it in f32), and
// the one representation of a bf16 value: a distinct 16-bit scalar type (its
// bits: static_cast<uint16_t>), so loops over it vectorize like integer loops.
enum class bfloat16 : uint16_t {};

// Scalar conversions. All round to nearest, ties to even. The bf16 pair is
// inline and branch-free so that loops over it vectorize.
[[gnu::always_inline]] inline bfloat16 f32_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;  // keep the sign, set the quiet bit
  return static_cast<bfloat16>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}
[[gnu::always_inline]] inline float bf16_to_f32(bfloat16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}
// f16 values travel as their raw bits.
uint16_t f32_to_f16(float x);  // overflow -> inf (IEEE)
float f16_to_f32(uint16_t bits);
uint8_t f32_to_e4m3(float x);  // saturates to +-448; NaN -> NaN
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e5m2(float x);  // saturates to +-57344 (inf too); NaN -> NaN
float e5m2_to_f32(uint8_t bits);

// Element i of a buffer of type t, widened to double (exact for every dtype but i64 > 2^53).
// f64 is there for float64 references (gradient checks).
double load_as_double(const void* data, DType t, size_t i);
// Store v (rounded to nearest even, fp8 saturating; integers rounded to nearest) as element i.
void store_from_double(void* data, DType t, size_t i, double v);
// Convert n elements from one dtype to another.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace meshtrain
