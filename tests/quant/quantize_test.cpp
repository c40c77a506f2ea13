// quantize_row: known answers for fixed inputs, and quantize-then-dequantize error within
// each format's bound (reason beside each bound).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "support/test_support.h"

namespace frink {
namespace {

using namespace quant;

TEST(Quantize, Q8_0KnownAnswer) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // amax 16 at j = 0
  BlockQ8_0 b;
  quantize_row(GgmlType::Q8_0, x, &b, 32);
  EXPECT_EQ(b.d, f32_to_f16(16.0f / 127));  // d = amax / 127, stored as fp16
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[17], 8);    // 1 * 127/16 = 7.94 -> 8
  EXPECT_EQ(b.qs[18], 16);   // 2 * 127/16 = 15.88 -> 16
  EXPECT_EQ(b.qs[31], 119);  // 15 * 127/16 = 119.06 -> 119
}

TEST(Quantize, Q4_0KnownAnswer) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8);  // the -8 end is hit first
  BlockQ4_0 b;
  quantize_row(GgmlType::Q4_0, x, &b, 32);
  EXPECT_EQ(b.d, 0x3C00);  // d = max / -8 = 1.0
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4)) << j;  // q = x + 8
}

TEST(Quantize, Q8_KKnownAnswer) {
  std::vector<float> x(256, 0.0f);
  x[3] = -2.0f;  // the signed max: iscale = -127 / -2
  x[4] = 1.0f;
  x[5] = 0.0236220472f;  // 1.5 / 63.5: exactly between 1 and 2 after scaling -> even (2)
  BlockQ8_K b;
  quantize_row(GgmlType::Q8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 2.0f / 127);
  EXPECT_EQ(b.qs[3], -127);
  EXPECT_EQ(b.qs[4], 64);  // 63.5 rounds half to even
  EXPECT_EQ(b.bsums[0], -127 + 64 + b.qs[5]);
}

TEST(Quantize, F16AndBF16RoundToNearestEven) {
  // Between 1.0 (0x3C00) and the next half 1 + 2^-10: the midpoint goes to even.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // rounds up past the largest half: inf
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7FC00001u)) & 0x7FC0, 0x7FC0);  // NaN stays NaN
  // Every half round-trips, and f32_to_f16 agrees with the compiler's _Float16 (IEEE RNE).
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(rng) & 0xC7FFFFFFu);  // exponents near half's range
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << f;
  }
  for (uint32_t h = 0; h < 0x7C00; ++h) ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
}

// Per-element bounds for the legacy types, with d the block's step: rounding to nearest
// costs d/2; the end of Q4_0/Q5_0's range opposite the signed max maps to +8 (+16) and is
// clamped to 7 (15), costing a whole d; storing d (and m) as fp16 costs 2^-11 relative,
// times at most 16 (32) steps. Q8_0: 127 steps of amax/127.
double legacy_bound(GgmlType t, const float* x) {
  float amax = 0, mn = x[0], mx = x[0];
  for (int j = 0; j < 32; ++j) {
    amax = std::max(amax, std::fabs(x[j]));
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const double fp16 = 0x1p-11;
  switch (t) {
    case GgmlType::Q8_0: return amax / 127 * (0.5 + 127 * fp16);
    case GgmlType::Q4_0: return amax / 8 * (1.0 + 8 * fp16);
    case GgmlType::Q5_0: return amax / 16 * (1.0 + 16 * fp16);
    case GgmlType::Q4_1: return (mx - mn) / 15 * (0.5 + 15 * fp16) + std::fabs(mn) * fp16;
    case GgmlType::Q5_1: return (mx - mn) / 31 * (0.5 + 31 * fp16) + std::fabs(mn) * fp16;
    default: return 0;
  }
}

TEST(Quantize, LegacyRoundTripWithinOneStep) {
  std::mt19937 rng(11);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q5_1}) {
    const int64_t n = 32 * 64;
    const auto x = test::random_floats(rng, n, 0.02f);
    std::vector<uint8_t> q(ggml_row_bytes(t, n));
    std::vector<float> y(n);
    quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      const double bound = legacy_bound(t, x.data() + 32 * b) * 1.0001;  // + float slack
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(y[32 * b + j] - x[32 * b + j]), bound) << ggml_type_name(t) << " block " << b;
    }
  }
}

// K-quants have no simple per-element bound (the scale search trades some elements for
// others), so the bound is on NMSE for Gaussian data. A uniform quantizer with step D has
// mean squared error D^2/12; a sub-block's range is about 4.5 sigma, so with 16/32/64 levels
// D ~ 0.28/0.14/0.07 sigma and NMSE ~ 6.5e-3/1.6e-3/4e-4. The search does better than the
// plain min/max grid; the bounds are those figures, so a broken search or scale packing
// (which costs far more than a factor) fails. Activations: Q8_0/Q8_K, D = amax/127.
TEST(Quantize, RoundTripNmseWithinFormatBound) {
  std::mt19937 rng(21);
  const std::vector<std::pair<GgmlType, double>> cases = {
      {GgmlType::Q4_K, 6.5e-3}, {GgmlType::Q5_K, 1.6e-3}, {GgmlType::Q6_K, 4e-4},
      {GgmlType::Q8_0, 1e-4},   {GgmlType::Q8_1, 1e-4},   {GgmlType::Q8_K, 1e-4},
      {GgmlType::F16, 1e-7},    {GgmlType::BF16, 1e-5}};
  for (const auto& [t, bound] : cases) {
    const int64_t n = 256 * 32;
    const auto x = test::random_floats(rng, n);
    std::vector<uint8_t> q(ggml_row_bytes(t, n));
    std::vector<float> y(n);
    quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    const double e = test::nmse(y.data(), x.data(), n);
    EXPECT_LT(e, bound) << ggml_type_name(t);
    std::printf("%-5s round-trip NMSE %.3g (bound %.3g)\n", std::string(ggml_type_name(t)).c_str(), e, bound);
  }
}

TEST(Quantize, Q8_1SumField) {
  std::mt19937 rng(3);
  const auto x = test::random_floats(rng, 32);
  BlockQ8_1 b;
  quantize_row(GgmlType::Q8_1, x.data(), &b, 32);
  int sum = 0;
  for (int j = 0; j < 32; ++j) sum += b.qs[j];
  // ggml stores s = fp16(sum * d) with d the UNROUNDED f32 scale, so s matches sum * fp16(d)
  // to within fp16 rounding of both (2 * 2^-11 relative).
  EXPECT_NEAR(f16_to_f32(b.s), sum * f16_to_f32(b.d), std::fabs(sum * f16_to_f32(b.d)) * 0x1p-10);
}

TEST(Quantize, AllZeroBlocksStayZero) {
  std::vector<float> zero(256, 0.0f), y(256, 1.0f);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K}) {
    std::vector<uint8_t> q(ggml_row_bytes(t, 256));
    quantize_row(t, zero.data(), q.data(), 256);
    dequantize_row(t, q.data(), y.data(), 256);
    for (float v : y) ASSERT_EQ(v, 0.0f) << ggml_type_name(t);
  }
}

}  // namespace
}  // namespace frink
