// Dot products: SIMD against the scalar reference, both against the dequantized values,
// and vec_dot_rows against vec_dot, for every weight type and 1..8 blocks.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "quant/simd_kernels.h"

namespace frink {
namespace {

struct Case {
  std::vector<uint8_t> w, act;
  std::vector<float> w_f, act_f;  // dequantized weight and activation
  double abs_sum = 0;             // sum |w_i * a_i| of the dequantized values
};

Case make_case(std::mt19937& rng, GgmlType t, int64_t n) {
  Case c;
  c.w = test::random_weight_row(rng, t, n);
  const GgmlType at = vec_dot_type(t);
  const auto x = test::random_floats(rng, n);
  c.act.resize(ggml_row_bytes(at, n));
  quantize_row(at, x.data(), c.act.data(), n);
  c.w_f.resize(n);
  c.act_f.resize(n);
  dequantize_row(t, c.w.data(), c.w_f.data(), n);
  dequantize_row(at, c.act.data(), c.act_f.data(), n);
  for (int64_t i = 0; i < n; ++i) c.abs_sum += std::fabs(double(c.w_f[i]) * c.act_f[i]);
  return c;
}

// Q4_1/Q5_1 take their offset term m * d_a * sum(q_a) from Q8_1's s field, which ggml
// stores as fp16: that term is off by up to half an fp16 ulp (2^-11 relative) of
// |d_a * sum(q_a)| per block, times |m|. The dequantized reference has no such rounding, so
// the comparison with it allows this much more (the SIMD/scalar comparison does not).
double q8_1_sum_rounding(GgmlType t, const Case& c, int64_t n) {
  if (vec_dot_type(t) != GgmlType::Q8_1) return 0;
  const size_t blk_bytes = ggml_type_info(t).block_bytes;
  double extra = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    uint16_t m_bits;  // m follows d in both BlockQ4_1 and BlockQ5_1
    std::memcpy(&m_bits, c.w.data() + b * blk_bytes + 2, 2);
    double a_sum = 0;
    for (int j = 0; j < 32; ++j) a_sum += c.act_f[32 * b + j];
    extra += std::fabs(f16_to_f32(m_bits)) * std::fabs(a_sum) * 0x1p-11;
  }
  return extra;
}

// Lengths: 1..8 blocks; the plain types also get lengths that leave a SIMD tail.
std::vector<int64_t> lengths(GgmlType t) {
  const int64_t blk = ggml_type_info(t).is_quantized ? ggml_type_info(t).block_elems : 32;
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= 8; ++k) out.push_back(k * blk);
  if (!ggml_type_info(t).is_quantized) out.insert(out.end(), {1, 7, 9, 15, 17, 33, 100});
  return out;
}

// Bound for two float evaluations of the same sum: both add the SAME exact integer block
// dots (or the same float products), differing only in the order and grouping of float
// additions and scale multiplies. Each float op rounds by at most 2^-24 ~ 6e-8 relative
// to its operands, and no element passes through more than ~40 of them (8 blocks x a few
// scale products + a log2(64)-deep horizontal sum), so the difference is below
// 40 * 6e-8 * sum|w_i a_i| = 2.4e-6 * sum|w_i a_i|; 1e-5 leaves a margin of 4 but would
// catch a dropped block, a wrong scale or a sign error (each moves the result by a whole
// term, ~1/n of sum|w a| >= 1/256).
constexpr double kRelTol = 1e-5;

TEST(Dot, SimdMatchesScalarAndDequantized) {
  std::printf("host SIMD level: %s\n", host_simd_level());
  std::mt19937 rng(1234);
  int n_cases = 0;
  for (GgmlType t : test::weight_types()) {
    ASSERT_TRUE(host_supports(t)) << ggml_type_name(t);
    for (int64_t n : lengths(t)) {
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE(std::string(ggml_type_name(t)) + " n=" + std::to_string(n));
        const Case c = make_case(rng, t, n);
        const float simd = vec_dot(t, c.w.data(), c.act.data(), n);
        const bool was = force_scalar_kernels(true);
        const float scalar = vec_dot(t, c.w.data(), c.act.data(), n);
        force_scalar_kernels(was);
        double ref = 0;
        for (int64_t i = 0; i < n; ++i) ref += double(c.w_f[i]) * c.act_f[i];
        const double tol = kRelTol * c.abs_sum + 1e-30;
        EXPECT_NEAR(simd, scalar, tol);
        EXPECT_NEAR(scalar, ref, tol + q8_1_sum_rounding(t, c, n));
        ++n_cases;
      }
    }
  }
  EXPECT_GT(n_cases, 300);
}

// The dispatcher runs only the best level the CPU has; this checks the other x86 kernel
// sets directly (same bound and reason as above), where the CPU can execute them.
TEST(Dot, EveryX86LevelMatchesScalar) {
  std::mt19937 rng(77);
  using Table = quant::SimdDot (*)(GgmlType);
  std::vector<std::pair<const char*, Table>> levels;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    levels.emplace_back("avx2", quant::avx2_dot_kernel);
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    levels.emplace_back("avx512", quant::avx512_dot_kernel);
  if (levels.empty()) GTEST_SKIP() << "no x86 SIMD level on this CPU";
  for (const auto& [name, table] : levels) {
    for (GgmlType t : test::weight_types()) {
      const quant::SimdDot k = table(t);
      if (!k.dot) continue;
      for (int64_t n : lengths(t)) {
        SCOPED_TRACE(std::string(name) + " " + std::string(ggml_type_name(t)) + " n=" + std::to_string(n));
        const Case c = make_case(rng, t, n);
        const bool was = force_scalar_kernels(true);
        const float scalar = vec_dot(t, c.w.data(), c.act.data(), n);
        force_scalar_kernels(was);
        EXPECT_NEAR(k.dot(c.w.data(), c.act.data(), n), scalar, kRelTol * c.abs_sum + 1e-30);
      }
    }
  }
}

// vec_dot_rows runs the same per-row arithmetic in its 4-row kernels as vec_dot's 1-row
// kernel (same operations, same order), so the results must be IDENTICAL; rows are padded
// (stride > row bytes) to catch a stride mix-up, and 1..9 rows cover groups and remainders.
TEST(Dot, RowsEqualSingleDotsExactly) {
  std::mt19937 rng(99);
  for (GgmlType t : test::weight_types()) {
    const int64_t n = 4 * (ggml_type_info(t).is_quantized ? ggml_type_info(t).block_elems : 32);
    const size_t row_bytes = ggml_row_bytes(t, n);
    const size_t stride = row_bytes + 64;
    for (int64_t n_rows = 1; n_rows <= 9; ++n_rows) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " rows=" + std::to_string(n_rows));
      std::vector<uint8_t> w(stride * n_rows, 0xCD);
      for (int64_t r = 0; r < n_rows; ++r) {
        const auto row = test::random_weight_row(rng, t, n);
        std::copy(row.begin(), row.end(), w.begin() + r * stride);
      }
      const auto x = test::random_floats(rng, n);
      std::vector<uint8_t> act(ggml_row_bytes(vec_dot_type(t), n));
      quantize_row(vec_dot_type(t), x.data(), act.data(), n);
      std::vector<float> out(n_rows);
      vec_dot_rows(t, w.data(), stride, n_rows, act.data(), n, out.data());
      for (int64_t r = 0; r < n_rows; ++r) EXPECT_EQ(out[r], vec_dot(t, w.data() + r * stride, act.data(), n)) << r;
    }
  }
}

TEST(Dot, VecDotTypesAreLlamaCpps) {
  EXPECT_EQ(vec_dot_type(GgmlType::Q4_0), GgmlType::Q8_0);
  EXPECT_EQ(vec_dot_type(GgmlType::MXFP4), GgmlType::Q8_0);
  EXPECT_EQ(vec_dot_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
  EXPECT_EQ(vec_dot_type(GgmlType::Q5_1), GgmlType::Q8_1);
  EXPECT_EQ(vec_dot_type(GgmlType::Q4_1), GgmlType::Q8_1);
  EXPECT_EQ(vec_dot_type(GgmlType::Q3_K), GgmlType::Q8_K);
  EXPECT_EQ(vec_dot_type(GgmlType::IQ4_XS), GgmlType::Q8_K);
  EXPECT_EQ(vec_dot_type(GgmlType::BF16), GgmlType::BF16);
  EXPECT_FALSE(host_supports(GgmlType::IQ2_XXS));
  EXPECT_FALSE(host_supports(GgmlType::Q8_K));  // an activation type, never a weight
}

}  // namespace
}  // namespace frink
