#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/copy.h"
#include "core/error.h"

namespace meshtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::f8e4m3:
      return 1;
    case DType::f8e5m2:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f64:
      return 8;
  }
  // Every DType is one of the cases above: no input (a file's dtype string, a
  // config key) becomes a DType except through parse_dtype.
  MT_ASSERT(false, "dtype_size: invalid dtype code {}", static_cast<int>(t));
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::f8e4m3:
      return "f8e4m3";
    case DType::f8e5m2:
      return "f8e5m2";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::f64:
      return "f64";
  }
  return "invalid";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias aliases[] = {{"f32", DType::f32},       {"float32", DType::f32},
                                      {"float", DType::f32},     {"bf16", DType::bf16},
                                      {"bfloat16", DType::bf16}, {"f16", DType::f16},
                                      {"float16", DType::f16},   {"half", DType::f16},
                                      {"f8e4m3", DType::f8e4m3}, {"float8_e4m3fn", DType::f8e4m3},
                                      {"f8e5m2", DType::f8e5m2}, {"float8_e5m2", DType::f8e5m2},
                                      {"i32", DType::i32},       {"int32", DType::i32},
                                      {"i64", DType::i64},       {"int64", DType::i64},
                                      {"f64", DType::f64},       {"float64", DType::f64},
                                      {"double", DType::f64}};
  for (const auto& a : aliases)
    if (a.name == name) return a.type;
  throw InvalidArgument(
      fmt::format("unknown dtype '{}': expected one of f32, bf16, f16, f8e4m3, f8e5m2, i32, i64, f64", name));
}

bool is_floating(DType t) { return t != DType::i32 && t != DType::i64; }

namespace {

// A binary floating-point format narrower than f32, described by its fields.
struct FloatFormat {
  int mantissa_bits;
  int exponent_bits;
  int bias;
  bool has_inf;       // false: the all-ones exponent still holds finite values (e4m3)
  bool saturate;      // overflow (and inf) -> largest finite instead of inf
  uint32_t nan_bits;  // canonical NaN, without sign
  double max_finite;
};

constexpr FloatFormat kF16{10, 5, 15, true, false, 0x7E00, 65504.0};
constexpr FloatFormat kBF16{7, 8, 127, true, false, 0x7FC0, 3.3895313892515355e38};
constexpr FloatFormat kE4M3{3, 4, 7, false, true, 0x7F, 448.0};
constexpr FloatFormat kE5M2{2, 5, 15, true, true, 0x7E, 57344.0};

uint32_t encode_finite_magnitude(double v, const FloatFormat& f) {
  const int emin = 1 - f.bias;
  if (v < std::ldexp(1.0, emin))  // subnormal (or zero): exponent field 0
    return static_cast<uint32_t>(std::ldexp(v, f.mantissa_bits - emin));
  int e = 0;
  std::frexp(v, &e);
  const int unbiased = e - 1;
  const auto mantissa = static_cast<uint32_t>(std::ldexp(v, f.mantissa_bits - unbiased)) - (1u << f.mantissa_bits);
  return (static_cast<uint32_t>(unbiased + f.bias) << f.mantissa_bits) | mantissa;
}

// Round x to the nearest representable value (ties to even) and return its bits.
uint32_t encode(double x, const FloatFormat& f) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.mantissa_bits + f.exponent_bits) : 0u;
  const uint32_t inf_bits = ((1u << f.exponent_bits) - 1) << f.mantissa_bits;
  if (std::isnan(x)) return sign | f.nan_bits;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | (f.saturate ? encode_finite_magnitude(f.max_finite, f) : inf_bits);
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);
  const int emin = 1 - f.bias;
  const int quantum_exp = std::max(e - 1, emin) - f.mantissa_bits;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  if (rounded > f.max_finite) {
    if (f.saturate || !f.has_inf) return sign | encode_finite_magnitude(f.max_finite, f);
    return sign | inf_bits;
  }
  return sign | encode_finite_magnitude(rounded, f);
}

double decode(uint32_t bits, const FloatFormat& f) {
  const int total = f.mantissa_bits + f.exponent_bits;
  const bool negative = (bits >> total) & 1u;
  const uint32_t exp_field = (bits >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  const uint32_t mantissa = bits & ((1u << f.mantissa_bits) - 1);
  const uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  double v;
  if (f.has_inf && exp_field == exp_all_ones) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && exp_field == exp_all_ones && mantissa == (1u << f.mantissa_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (exp_field == 0) {
    v = std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<double>(mantissa + (1u << f.mantissa_bits)),
                   static_cast<int>(exp_field) - f.bias - f.mantissa_bits);
  }
  return negative ? -v : v;
}

}  // namespace

uint16_t f32_to_f16(float x) { return static_cast<uint16_t>(encode(x, kF16)); }
float f16_to_f32(uint16_t bits) { return static_cast<float>(decode(bits, kF16)); }
uint8_t f32_to_e4m3(float x) { return static_cast<uint8_t>(encode(x, kE4M3)); }
float e4m3_to_f32(uint8_t bits) { return static_cast<float>(decode(bits, kE4M3)); }
uint8_t f32_to_e5m2(float x) { return static_cast<uint8_t>(encode(x, kE5M2)); }
float e5m2_to_f32(uint8_t bits) { return static_cast<float>(decode(bits, kE5M2)); }

double load_as_double(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(data)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const bfloat16*>(data)[i]);
    case DType::f16:
      return decode(static_cast<const uint16_t*>(data)[i], kF16);
    case DType::f8e4m3:
      return decode(static_cast<const uint8_t*>(data)[i], kE4M3);
    case DType::f8e5m2:
      return decode(static_cast<const uint8_t*>(data)[i], kE5M2);
    case DType::i32:
      return static_cast<const int32_t*>(data)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::f64:
      return static_cast<const double*>(data)[i];
  }
  return 0.0;
}

namespace {
template <typename Int>
Int round_to_int(double v) {
  if (std::isnan(v)) return 0;
  const double r = std::nearbyint(v);
  if (r >= static_cast<double>(std::numeric_limits<Int>::max())) return std::numeric_limits<Int>::max();
  if (r <= static_cast<double>(std::numeric_limits<Int>::min())) return std::numeric_limits<Int>::min();
  return static_cast<Int>(r);
}
}  // namespace

void store_from_double(void* data, DType t, size_t i, double v) {
  switch (t) {
    // double -> float rounds to nearest even in the default FP environment.
    case DType::f32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      return;
    case DType::bf16:
      static_cast<bfloat16*>(data)[i] = static_cast<bfloat16>(encode(v, kBF16));
      return;
    case DType::f16:
      static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(encode(v, kF16));
      return;
    case DType::f8e4m3:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(encode(v, kE4M3));
      return;
    case DType::f8e5m2:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(encode(v, kE5M2));
      return;
    case DType::i32:
      static_cast<int32_t*>(data)[i] = round_to_int<int32_t>(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(data)[i] = round_to_int<int64_t>(v);
      return;
    case DType::f64:
      static_cast<double*>(data)[i] = v;
      return;
  }
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    move_bytes(dst, src, n * dtype_size(src_type));
    return;
  }
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<bfloat16*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (src_type == DType::bf16 && dst_type == DType::f32) {
    const auto* s = static_cast<const bfloat16*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_from_double(dst, dst_type, i, load_as_double(src, src_type, i));
}

}  // namespace meshtrain
