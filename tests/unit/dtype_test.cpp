// Conversions checked against independent references: the compiler's own
// _Float16 for f16, and an exhaustive nearest-value search over every code
// for the 8-bit formats.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"

using namespace meshtrain;

namespace {

// Reference encoder: decode every code, pick the nearest finite value (ties
// to the even code), saturate beyond the largest finite value.
uint8_t nearest_fp8(float x, float (*decode)(uint8_t)) {
  if (std::isnan(x)) return 0;  // caller checks NaN separately
  int best = -1;
  double best_err = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    const float v = decode(static_cast<uint8_t>(code));
    if (!std::isfinite(v)) continue;
    if (std::signbit(v) != std::signbit(x)) continue;  // keep the sign (also of zero)
    const double err = std::fabs(static_cast<double>(v) - x);
    const bool even = (code & 1) == 0;
    if (err < best_err || (err == best_err && even)) {
      best = code;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

std::vector<float> sample_floats(float scale, int n) {
  std::mt19937 rng(123);
  std::uniform_real_distribution<float> mag(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-24, 18);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(std::ldexp(mag(rng), ex(rng)) * scale);
  return v;
}

}  // namespace

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8e5m2), 1u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  try {
    parse_dtype("f12");
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'f12'"), std::string::npos) << e.what();
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(static_cast<uint16_t>(f32_to_bf16(1.0f)), 0x3F80);
  // Exactly halfway between 0x3F80 and 0x3F81: ties to the even 0x3F80.
  EXPECT_EQ(static_cast<uint16_t>(f32_to_bf16(std::bit_cast<float>(0x3F808000u))), 0x3F80);
  // Halfway between 0x3F81 and 0x3F82: ties to the even 0x3F82.
  EXPECT_EQ(static_cast<uint16_t>(f32_to_bf16(std::bit_cast<float>(0x3F818000u))), 0x3F82);
  EXPECT_EQ(static_cast<uint16_t>(f32_to_bf16(std::bit_cast<float>(0x3F808001u))), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max())), std::numeric_limits<float>::infinity());
  // The fast path and the generic double path agree.
  for (float x : sample_floats(1.0f, 20000)) {
    bfloat16 generic{};
    store_from_double(&generic, DType::bf16, 0, x);
    ASSERT_EQ(f32_to_bf16(x), generic) << x;
  }
}

TEST(DType, F16MatchesCompilerConversion) {
  std::vector<float> values = sample_floats(1.0f, 50000);
  for (float x : {65504.0f, 65519.0f, 65520.0f, 1e6f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, -0.0f, 0.0f,
                  std::numeric_limits<float>::infinity()})
    values.push_back(x);
  for (float x : values) {
    const auto ref = static_cast<_Float16>(x);
    ASSERT_EQ(f32_to_f16(x), std::bit_cast<uint16_t>(ref)) << x;
  }
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto h = std::bit_cast<_Float16>(static_cast<uint16_t>(code));
    const float ref = static_cast<float>(h);
    const float got = f16_to_f32(static_cast<uint16_t>(code));
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(got)) << code;
    else
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(ref)) << code;
  }
}

TEST(DType, E4M3KnownValuesAndSaturation) {
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);                // largest finite
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));          // S.1111.111
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(17.0f), f32_to_e4m3(16.0f));    // tie between 16 and 18 -> even
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9 -> 0
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, E5M2KnownValuesAndSaturation) {
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7C)));
  EXPECT_TRUE(std::isnan(e5m2_to_f32(0x7E)));
  EXPECT_EQ(e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f32_to_e5m2(60000.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(std::numeric_limits<float>::infinity()), 0x7B);
  EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Fp8MatchesExhaustiveNearestSearch) {
  for (float scale : {1.0f, 1e-3f, 300.0f}) {
    for (float x : sample_floats(scale, 4000)) {
      ASSERT_EQ(f32_to_e4m3(x), nearest_fp8(x, e4m3_to_f32)) << x;
      ASSERT_EQ(f32_to_e5m2(x), nearest_fp8(x, e5m2_to_f32)) << x;
    }
  }
  // Every finite code round-trips, and every midpoint between neighbours goes to the even code.
  for (int code = 0; code < 256; ++code) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isfinite(v)) {
      ASSERT_EQ(f32_to_e4m3(v), code) << code;
    }
    const float w = e5m2_to_f32(static_cast<uint8_t>(code));
    if (std::isfinite(w)) {
      ASSERT_EQ(f32_to_e5m2(w), code) << code;
    }
  }
  for (int code = 0; code < 0x7E; ++code) {
    const float mid = (e4m3_to_f32(static_cast<uint8_t>(code)) + e4m3_to_f32(static_cast<uint8_t>(code + 1))) / 2;
    ASSERT_EQ(f32_to_e4m3(mid), code % 2 == 0 ? code : code + 1) << code;
  }
}

TEST(DType, ConvertBuffersAndIntegers) {
  const float src[] = {1.5f, -2.25f, 3.0f, 1e10f};
  int32_t ints[4];
  convert(src, DType::f32, ints, DType::i32, 4);
  EXPECT_EQ(ints[0], 2);  // 1.5 rounds to even
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(ints[2], 3);
  EXPECT_EQ(ints[3], std::numeric_limits<int32_t>::max());  // saturates, never wraps
  int64_t big[] = {int64_t{1} << 40};
  int32_t small[1];
  convert(big, DType::i64, small, DType::i32, 1);
  EXPECT_EQ(small[0], std::numeric_limits<int32_t>::max());
}
