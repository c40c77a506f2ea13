// vec_dot_tile against vec_dot, for every weight type and every x86 kernel set the CPU
// can run: an n_rows x n_tok block must equal the per-element vec_dot EXACTLY (the tile
// kernels run each element's arithmetic in the one-row kernel's order; see
// dot_x86_tile.h), which is what keeps prompt logits independent of the batch split.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "quant/simd_kernels.h"

namespace frink {
namespace {

// Row and token counts: 1, tile-sized, and odd ones that leave row and token tails.
struct Shape { int64_t n_rows, n_tok, n_blocks; };
constexpr Shape kShapes[] = {{1, 1, 1}, {1, 5, 2}, {3, 1, 3}, {4, 4, 1}, {5, 7, 2},
                             {8, 8, 3}, {9, 13, 1}, {2, 2, 4}, {17, 6, 2}};

struct Operands {
  std::vector<uint8_t> w, act;
  size_t w_stride = 0, act_stride = 0;
};

// Rows and activations padded (strides > row bytes) with 0xCD, to catch a stride mix-up.
Operands make_operands(std::mt19937& rng, GgmlType t, const Shape& s, int64_t n) {
  Operands o;
  o.w_stride = ggml_row_bytes(t, n) + 32;
  o.w.assign(o.w_stride * s.n_rows, 0xCD);
  for (int64_t r = 0; r < s.n_rows; ++r) {
    const auto row = test::random_weight_row(rng, t, n);
    std::copy(row.begin(), row.end(), o.w.begin() + r * o.w_stride);
  }
  const GgmlType at = vec_dot_type(t);
  o.act_stride = ggml_row_bytes(at, n) + 16;
  o.act.assign(o.act_stride * s.n_tok, 0xCD);
  for (int64_t k = 0; k < s.n_tok; ++k) {
    const auto x = test::random_floats(rng, n);
    quantize_row(at, x.data(), o.act.data() + k * o.act_stride, n);
  }
  return o;
}

// n: whole blocks; the plain types also get a length with a 16- and an 8-element tail.
std::vector<int64_t> lengths(GgmlType t, int64_t n_blocks) {
  const bool plain = !ggml_type_info(t).is_quantized;
  const int64_t blk = plain ? 32 : ggml_type_info(t).block_elems;
  if (plain) return {n_blocks * blk, n_blocks * blk + 8 + 3};
  return {n_blocks * blk};
}

using TileFn = quant::DotTileFn;

void expect_tile_equals_vec_dot(const char* level, TileFn tile) {
  std::mt19937 rng(4321);
  for (GgmlType t : test::weight_types()) {
    for (const Shape& s : kShapes) {
      for (int64_t n : lengths(t, s.n_blocks)) {
        SCOPED_TRACE(std::string(level) + " " + std::string(ggml_type_name(t)) + " rows=" + std::to_string(s.n_rows) +
                     " tok=" + std::to_string(s.n_tok) + " n=" + std::to_string(n));
        const Operands o = make_operands(rng, t, s, n);
        const size_t out_stride = static_cast<size_t>(s.n_rows) + 3;
        std::vector<float> out(out_stride * s.n_tok, -1.0f);
        if (tile)
          tile(o.w.data(), o.w_stride, s.n_rows, o.act.data(), o.act_stride, s.n_tok, n, out.data(), out_stride);
        else
          vec_dot_tile(t, o.w.data(), o.w_stride, s.n_rows, o.act.data(), o.act_stride, s.n_tok, n, out.data(),
                       out_stride);
        for (int64_t k = 0; k < s.n_tok; ++k) {
          for (int64_t r = 0; r < s.n_rows; ++r) {
            const float want = vec_dot(t, o.w.data() + r * o.w_stride, o.act.data() + k * o.act_stride, n);
            ASSERT_EQ(out[k * out_stride + r], want) << "row " << r << " token " << k;
          }
          for (size_t r = s.n_rows; r < out_stride; ++r) ASSERT_EQ(out[k * out_stride + r], -1.0f) << "padding";
        }
      }
    }
  }
}

TEST(DotTile, DispatchedEqualsVecDotExactly) {
  std::printf("host SIMD level: %s\n", host_simd_level());
  expect_tile_equals_vec_dot(host_simd_level(), nullptr);
}

// The scalar fallback (vec_dot_rows per token) against the scalar vec_dot.
TEST(DotTile, ScalarFallbackEqualsVecDotExactly) {
  const bool was = force_scalar_kernels(true);
  expect_tile_equals_vec_dot("scalar", nullptr);
  force_scalar_kernels(was);
}

// Each x86 level's tile against the SAME level's one-row kernel (vec_dot runs only the
// best level, so a lower level's tile is compared with that level's vec_dot_rows).
TEST(DotTile, EveryX86LevelEqualsItsRowKernelExactly) {
  using Table = quant::SimdDot (*)(GgmlType);
  std::vector<std::pair<const char*, Table>> levels;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    levels.emplace_back("avx2", quant::avx2_dot_kernel);
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    levels.emplace_back("avx512", quant::avx512_dot_kernel);
  if (levels.empty()) GTEST_SKIP() << "no x86 SIMD level on this CPU";
  std::mt19937 rng(8765);
  int n_tiled = 0;
  for (const auto& [name, table] : levels) {
    for (GgmlType t : test::weight_types()) {
      const quant::SimdDot k = table(t);
      if (!k.tile) continue;
      ++n_tiled;
      for (const Shape& s : kShapes) {
        for (int64_t n : lengths(t, s.n_blocks)) {
          SCOPED_TRACE(std::string(name) + " " + std::string(ggml_type_name(t)) + " rows=" + std::to_string(s.n_rows) +
                       " tok=" + std::to_string(s.n_tok) + " n=" + std::to_string(n));
          const Operands o = make_operands(rng, t, s, n);
          std::vector<float> out(s.n_rows * s.n_tok), want(s.n_rows);
          k.tile(o.w.data(), o.w_stride, s.n_rows, o.act.data(), o.act_stride, s.n_tok, n, out.data(), s.n_rows);
          for (int64_t tok = 0; tok < s.n_tok; ++tok) {
            k.rows(o.w.data(), o.w_stride, s.n_rows, o.act.data() + tok * o.act_stride, n, want.data());
            for (int64_t r = 0; r < s.n_rows; ++r) ASSERT_EQ(out[tok * s.n_rows + r], want[r]) << r << "," << tok;
          }
        }
      }
    }
  }
  // F32, F16, BF16, Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K per level.
  EXPECT_EQ(n_tiled, 11 * static_cast<int>(levels.size()));
}

}  // namespace
}  // namespace frink
