// Matrix products on the device (matmul.cuh: every type, decode and prompt shapes, epilogues,
// grouped and two-type launches, split rows, the reordered x8 layouts, embedding rows) against the
// host's dequantization; bounds NMSE against a double-precision product, each with its reason.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include "cpu/layer_body.h"
#include "cpu/matmul.h"
#include "cuda/embed.cuh"
#include "cuda/matmul.cuh"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

struct MatCase {
  int64_t n_in, n_out, n_tok;
  bool bias;
};

// x [n_tok][n_in] as the host rounds an activation for its vec_dot_type `at` (quantized, then
// dequantized, row by row).
std::vector<float> host_rounded(GgmlType at, const std::vector<float>& x, int64_t n_in, int64_t n_tok) {
  std::vector<float> xr(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(at, n_in)));
  for (int64_t tk = 0; tk < n_tok; ++tk) {
    quantize_row(at, x.data() + tk * n_in, q.data(), n_in);
    dequantize_row(at, q.data(), xr.data() + tk * n_in, n_in);
  }
  return xr;
}

// y[t][r] = scale * sum_i wf[r][i] x[t][i] (+ bias[r]), summed in double.
std::vector<float> reference_product(const std::vector<float>& wf, const std::vector<float>& x, int64_t n_in,
                                     int64_t n_out, int64_t n_tok, double scale, const float* bias) {
  std::vector<float> ref(static_cast<size_t>(n_out * n_tok));
  for (int64_t tk = 0; tk < n_tok; ++tk)
    for (int64_t r = 0; r < n_out; ++r) {
      double s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += double(wf[r * n_in + i]) * x[tk * n_in + i];
      ref[tk * n_out + r] = static_cast<float>(s * scale + (bias ? bias[r] : 0.0f));
    }
  return ref;
}

TEST(CudaKernels, MatmulEveryTypeMatchesHostDequant) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(7);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const std::vector<MatCase> cases = {{256, 7, 1, false},  {512, 33, 3, true},  {768, 65, 4, false},
                                      {1024, 17, 5, true}, {256, 130, 9, true}, {512, 77, 33, false},
                                      {56, 9, 2, false},   {37, 13, 1, true},   {72, 130, 12, false},
                                      {3072, 21, 1, true}};
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                     GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
    ASSERT_TRUE(cuda::matmul_supported(static_cast<int>(t))) << ggml_type_name(t);
    for (const MatCase& c : cases) {
      if (c.n_in % ggml_type_info(t).block_elems != 0) continue;
      const RandomWeights w = random_weights(rng, t, c.n_in, c.n_out);
      const auto x = random_floats(rng, c.n_in * c.n_tok);
      const auto b = random_floats(rng, c.n_out);
      // Reference: the host's exact dequantization, dotted in double.
      const auto ref = reference_product(w.f, x, c.n_in, c.n_out, c.n_tok, 0.5, c.bias ? b.data() : nullptr);
      Dev<uint8_t> dw(w.bytes);
      Dev<float> dx(x), db(b), dy(ref.size());
      Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(c.n_in, c.n_tok)));
      cuda::MatmulParams p = mat_params(t, dw.p, c.n_in, c.n_out, dx.p, c.n_tok, dy.p);
      p.bias = c.bias ? db.p : nullptr;
      p.scale = 0.5f;
      p.blas = blas;
      p.scratch = scratch.p;
      p.scratch_elems = scratch.n;
      cuda::launch_matmul(p);
      const auto y = dy.get();
      const double e = nmse(y.data(), ref.data(), ref.size());
      // Matrix-vector path: f32 products and sums of exactly the host's dequantized values
      // (1e-9 leaves room for f32 summation over 1024 terms, ~1e-13). cuBLAS path: both
      // operands rounded to f16 (2^-11 relative each): ~1e-7 expected, bound 1e-5.
      const double bound = c.n_tok <= cuda::kMatvecMaxTok ? 1e-9 : 1e-5;
      EXPECT_LT(e, bound) << ggml_type_name(t) << " n_in " << c.n_in << " n_out " << c.n_out << " n_tok " << c.n_tok;
    }
  }
  cublasDestroy(blas);
}

// act_round for every type: the activation is first rounded to the host's vec_dot_type
// (Q8_0/Q8_1 blocks, Q8_K, f16, bf16) exactly as the host rounds it (int8 for the dp4a
// kernels of Q4_0, Q8_0, Q4_K, Q5_K and Q6_K), so the product equals
// the host's dequantized weights dotted with the host-rounded activation: up to f32
// summation order on the matrix-vector path (1e-9), plus f16 operands on the cuBLAS path
// (1e-5). Inputs include an exact half at scale 1 and an all-zero block (Q8_K's d would be
// 0/0 there).
TEST(CudaKernels, ActivationRoundingMatchesHostForEveryType) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(23);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  // n_tok 5 = one 4-token and one 1-token launch, 8 two 4-token ones; 12 takes the cuBLAS path.
  // The staged kernels (rows a multiple of 16 bytes) see one chunk and a part (2304: Q4_0 64 +
  // 8 blocks, Q4_K 8 + 1), whole chunks (4096) and seven (14336, the 8B down projection);
  // 20001 rows give each warp of the stream kernel several row pairs, the last one half.
  const std::vector<MatCase> cases = {{256, 9, 1, false},  {512, 33, 3, true},   {768, 20, 12, false},
                                      {4096, 40, 5, true}, {4096, 40, 8, true},  {64, 3, 1, false},
                                      {2304, 9, 4, true},  {14336, 24, 1, false}, {512, 20001, 1, true}};
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
    const GgmlType at = vec_dot_type(t);
    for (const MatCase& c : cases) {
      if (c.n_in % ggml_type_info(t).block_elems != 0) continue;
      const RandomWeights w = random_weights(rng, t, c.n_in, c.n_out);
      auto x = random_floats(rng, c.n_in * c.n_tok);
      // A block whose scale comes out exactly 1 (largest magnitude 127, negative for Q8_K's
      // signed rule) holding an exact half: roundf (Q8_0/Q8_1) gives 3, rint (Q8_K) gives 2, so
      // the wrong rounding function for either format shows.
      x[1] = -127.0f;
      x[2] = 2.5f;
      if (x.size() >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
      const std::vector<float> xr = host_rounded(at, x, c.n_in, c.n_tok);
      const std::vector<float> ones(static_cast<size_t>(c.n_out), 1.0f);
      const auto ref = reference_product(w.f, xr, c.n_in, c.n_out, c.n_tok, 1.0, c.bias ? ones.data() : nullptr);
      Dev<uint8_t> dw(w.bytes);
      Dev<float> dx(x), db(ones), dy(ref.size()), dact(x.size());
      Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(c.n_in, c.n_tok)));
      cuda::MatmulParams p = mat_params(t, dw.p, c.n_in, c.n_out, dx.p, c.n_tok, dy.p);
      p.bias = c.bias ? db.p : nullptr;
      p.blas = blas;
      p.scratch = scratch.p;
      p.scratch_elems = scratch.n;
      p.act_round = dact.p;
      cuda::launch_matmul(p);
      const auto y = dy.get();
      const double e = nmse(y.data(), ref.data(), ref.size());
      EXPECT_LT(e, c.n_tok <= cuda::kMatvecMaxTok ? 1e-9 : 1e-5)
          << ggml_type_name(t) << " n_in " << c.n_in << " n_tok " << c.n_tok;
    }
  }
  cublasDestroy(blas);
}

// A residual added in the epilogue, into y itself (x = x + W h), equals the product followed
// by the add: bit for bit on every matrix-vector kernel and across the 4 + 1 token split; on
// cuBLAS batches (12, 40 tokens: matmul_adds_residual, beta = 1) to f32 rounding, as cuBLAS may
// pick another kernel, so another summation order, for beta 1; plain, 16-bit and
// dequantized-tile weights there. A bias or scale after the product, or a residual that is not
// y, keeps a cuBLAS batch's add a kernel of its own.
TEST(CudaKernels, ResidualInTheEpilogueEqualsAnAdd) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(37);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const int64_t n_in = 512, n_out = 48;
  Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(n_in, 40)));
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q5_1,
                     GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    for (int64_t n_tok : {1, 5, 12, 40}) {
      const RandomWeights w = random_weights(rng, t, n_in, n_out);
      const auto x = random_floats(rng, n_in * n_tok), r = random_floats(rng, n_out * n_tok);
      Dev<uint8_t> dw(w.bytes);
      Dev<float> dx(x), dy(static_cast<size_t>(n_out * n_tok)), dr(r), dact(x.size());
      cuda::MatmulParams p = mat_params(t, dw.p, n_in, n_out, dx.p, n_tok, dy.p);
      p.act_round = dact.p;
      p.blas = blas;
      p.scratch = scratch.p;
      p.scratch_elems = scratch.n;
      cuda::launch_matmul(p);
      auto expect = dy.get();
      for (size_t i = 0; i < expect.size(); ++i) expect[i] += r[i];
      p.y = dr.p;
      p.residual = dr.p;  // in place, as the backend does with the residual stream
      ASSERT_TRUE(cuda::matmul_adds_residual(p));
      cuda::launch_matmul(p);
      const auto got = dr.get();
      const std::string where = std::string(ggml_type_name(t)) + " n_tok " + std::to_string(n_tok);
      if (n_tok <= cuda::kMatvecMaxTok) {
        EXPECT_EQ(got, expect) << where;
        continue;
      }
      EXPECT_LT(nmse(got.data(), expect.data(), expect.size()), 1e-12) << where;
      cuda::MatmulParams q = p;
      q.scale = 0.5f;
      EXPECT_FALSE(cuda::matmul_adds_residual(q)) << where;
      q = p;
      q.residual = dy.p;
      EXPECT_FALSE(cuda::matmul_adds_residual(q)) << where;
    }
  }
  cublasDestroy(blas);
}

// launch_matmuls (products of one input prepared once) gives bit for bit what separate
// launch_matmul calls give, for groups that share one preparation, that alternate between
// forms (int8 Q8_0 and Q8 blocks; int8 Q8_K and Q8_K values, as a Q5_K_M file does), on both
// the matrix-vector and the cuBLAS path.
TEST(CudaKernels, GroupedProductsEqualSeparateOnes) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(29);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const std::vector<std::vector<GgmlType>> groups = {{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},
                                                     {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_0},
                                                     {GgmlType::F16, GgmlType::BF16, GgmlType::F16},
                                                     {GgmlType::Q8_0, GgmlType::Q8_0},
                                                     {GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q6_K},
                                                     {GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0},
                                                     {GgmlType::BF16, GgmlType::BF16},
                                                     {GgmlType::F32, GgmlType::F32, GgmlType::F32},
                                                     {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::F32}};
  const int64_t n_in = 512;
  for (int64_t n_tok : {1, 3, 12}) {
    for (const auto& types : groups) {
      const auto x = random_floats(rng, n_in * n_tok);
      Dev<float> dx(x), dact(x.size());
      Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(n_in, n_tok)));
      std::vector<std::unique_ptr<Dev<uint8_t>>> ws;
      std::vector<std::unique_ptr<Dev<float>>> ys_group, ys_alone;
      std::vector<cuda::MatmulParams> ps;
      for (size_t i = 0; i < types.size(); ++i) {
        // Odd row counts: a product's last row pair in the stream kernel holds one row.
        const int64_t n_out = 41 + 8 * static_cast<int64_t>(i);
        ws.push_back(std::make_unique<Dev<uint8_t>>(random_weights(rng, types[i], n_in, n_out).bytes));
        ys_group.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_out * n_tok)));
        ys_alone.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_out * n_tok)));
        cuda::MatmulParams p = mat_params(types[i], ws.back()->p, n_in, n_out, dx.p, n_tok, ys_group.back()->p);
        p.blas = blas;
        p.scratch = scratch.p;
        p.scratch_elems = scratch.n;
        p.act_round = dact.p;
        // A prefill group whose first product is matvec_only (as a router): the products after
        // it take cuBLAS and must prepare x themselves (it left no 16-bit copy behind).
        p.matvec_only = i == 0 && n_tok > cuda::kMatvecMaxTok;
        ps.push_back(p);
      }
      cuda::launch_matmuls(ps.data(), static_cast<int>(ps.size()));
      for (size_t i = 0; i < ps.size(); ++i) {
        cuda::MatmulParams p = ps[i];
        p.y = ys_alone[i]->p;
        cuda::launch_matmul(p);
      }
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_EQ(ys_group[i]->get(), ys_alone[i]->get())
            << ggml_type_name(types[i]) << " product " << i << " n_tok " << n_tok;
    }
  }
  cublasDestroy(blas);
}

// K-quant tiles of two types in one one-token launch (two_type_launch: Q4_K or Q5_K products
// then Q6_K ones, Q5_K then Q4_K, as the device keeps them) give bit for bit what one launch a
// product gives: each row's dot is its type's, whichever product the launch holds first; odd
// row counts (the second type starting mid-warp-block), a bias and the residual on the second.
// Four tokens are not grouped so and must equal too.
TEST(CudaKernels, TwoTypeLaunchesEqualOneTypeOnes) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  using G = GgmlType;
  const std::vector<std::vector<G>> groups = {{G::Q4_K, G::Q4_K, G::Q6_K}, {G::Q5_K, G::Q6_K},
                                              {G::Q5_K, G::Q4_K, G::Q4_K}, {G::Q5_K, G::Q5_K, G::Q6_K},
                                              {G::Q4_K, G::Q6_K, G::Q6_K}};
  for (const int64_t n_in : {2048, 4096})
    for (const int64_t n_tok : {1, 4})
      for (const auto& types : groups) {
        const auto x = random_floats(rng, n_in * n_tok);
        Dev<float> dx(x), dact(x.size());
        std::vector<std::unique_ptr<Dev<uint8_t>>> ws;
        std::vector<std::unique_ptr<Dev<float>>> ys_group, ys_alone, extra;
        std::vector<cuda::MatmulParams> ps;
        for (size_t i = 0; i < types.size(); ++i) {
          const int64_t n_out = 37 + 10 * static_cast<int64_t>(i);
          const auto wb = random_weights(rng, types[i], n_in, n_out).bytes;
          ws.push_back(std::make_unique<Dev<uint8_t>>(wb));
          const int type = to_x8(types[i], ws.back()->p, wb.size(), n_in);
          const auto y0 = random_floats(rng, n_out * n_tok);  // the residual, added in place
          ys_group.push_back(std::make_unique<Dev<float>>(y0));
          ys_alone.push_back(std::make_unique<Dev<float>>(y0));
          cuda::MatmulParams p = mat_params(types[i], ws.back()->p, n_in, n_out, dx.p, n_tok, ys_group.back()->p);
          p.type = type;
          p.act_round = dact.p;
          if (i + 1 == types.size()) {
            extra.push_back(std::make_unique<Dev<float>>(random_floats(rng, n_out)));
            p.bias = extra.back()->p;
            p.residual = p.y;
          }
          ps.push_back(p);
        }
        cuda::launch_matmuls(ps.data(), static_cast<int>(ps.size()));
        for (size_t i = 0; i < ps.size(); ++i) {
          cuda::MatmulParams p = ps[i];
          p.y = ys_alone[i]->p;
          if (p.residual) p.residual = p.y;
          cuda::launch_matmul(p);
        }
        for (size_t i = 0; i < ps.size(); ++i)
          EXPECT_EQ(ys_group[i]->get(), ys_alone[i]->get())
              << ggml_type_name(types[i]) << " product " << i << " n_in " << n_in << " n_tok " << n_tok;
      }
}

// Rows split over 2 or 4 warps (MatmulParams::ksplit) give the one-warp result up to f32
// summation order, on rows of 2 to 14 chunks (a partial last chunk, counts that KS does not
// divide, warps with no chunk), odd row counts, 1, 4 and 6 tokens, the residual in place, two grouped products,
// and expert slots; grouped equals separate bit for bit at the same split.
TEST(CudaKernels, SplitRowsMatchWholeRows) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(53);
  const int64_t n_out = 37;
  // Staged rows (16-byte multiples): Q6_K needs 2048-element multiples (6144: 3 chunks); Q4_0
  // at 2304 has 2 chunks, so at KS = 4 two warps of a group get none; Q4_0 and Q4_K at 14336
  // have 7, which at KS = 2 take the three-stage kernel.
  const std::vector<std::pair<GgmlType, int64_t>> cases = {
      {GgmlType::Q4_0, 7168}, {GgmlType::Q4_0, 2304}, {GgmlType::Q4_0, 14336}, {GgmlType::Q8_0, 7168},
      {GgmlType::Q4_K, 7168}, {GgmlType::Q4_K, 14336}, {GgmlType::Q5_K, 7168},
      {GgmlType::Q6_K, 6144}, {GgmlType::BF16, 7168}, {GgmlType::F16, 7168}};
  for (const auto& [t, n_in] : cases) {
    for (int64_t n_tok : {1, 4, 6}) {
      const auto x = random_floats(rng, n_in * n_tok), y0 = random_floats(rng, n_out * n_tok);
      Dev<float> dx(x), dact(x.size());
      Dev<uint8_t> w1(random_weights(rng, t, n_in, n_out).bytes), w2(random_weights(rng, t, n_in, n_out + 8).bytes);
      // ks -> (product 1 with the residual in place, product 2), grouped and separate.
      const auto run = [&](int ks, bool grouped) {
        Dev<float> y1(y0), y2(static_cast<size_t>((n_out + 8) * n_tok));
        cuda::MatmulParams ps[2] = {mat_params(t, w1.p, n_in, n_out, dx.p, n_tok, y1.p),
                                    mat_params(t, w2.p, n_in, n_out + 8, dx.p, n_tok, y2.p)};
        ps[0].residual = y1.p;
        for (cuda::MatmulParams& p : ps) {
          p.act_round = dact.p;
          p.ksplit = ks;
        }
        if (grouped) {
          cuda::launch_matmuls(ps, 2);
        } else {
          cuda::launch_matmul(ps[0]);
          cuda::launch_matmul(ps[1]);
        }
        return std::make_pair(y1.get(), y2.get());
      };
      const auto whole = run(1, false);
      for (int ks : {2, 4}) {
        const auto split = run(ks, false), group = run(ks, true);
        const std::string_view name = ggml_type_name(t);
        EXPECT_LT(nmse(split.first.data(), whole.first.data(), whole.first.size()), 1e-11)
            << name << " ks " << ks << " n_tok " << n_tok;
        EXPECT_LT(nmse(split.second.data(), whole.second.data(), whole.second.size()), 1e-11)
            << name << " ks " << ks << " n_tok " << n_tok;
        EXPECT_EQ(group.first, split.first) << name << " grouped, ks " << ks;
        EXPECT_EQ(group.second, split.second) << name << " grouped, ks " << ks;
      }
    }
  }
  // Expert slots (grid y) with split rows: each slot's row as with one warp per row pair.
  const int64_t n_in = 7168, n_expert = 3, k = 2, n_tok = 2, n_slots = n_tok * k;
  const std::vector<int32_t> ids = {2, 0, 1, 2};
  Dev<int32_t> dids(ids);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K}) {
    const auto x = random_floats(rng, n_in * n_tok);
    Dev<float> dx(x), dact(x.size());
    Dev<uint8_t> dw(random_weights(rng, t, n_in, n_out * n_expert).bytes);
    const auto run = [&](int ks) {
      Dev<float> dy(static_cast<size_t>(n_slots * n_out));
      cuda::MatmulParams p = mat_params(t, dw.p, n_in, n_out, dx.p, n_tok, dy.p);
      p.act_round = dact.p;
      p.slot_expert = dids.p;
      p.n_slots = n_slots;
      p.x_div = k;
      p.expert_bytes = ggml_row_bytes(t, n_in) * static_cast<size_t>(n_out);
      p.ksplit = ks;
      cuda::launch_matmul(p);
      return dy.get();
    };
    const auto whole = run(1);
    for (int ks : {2, 4}) {
      const auto split = run(ks);
      EXPECT_LT(nmse(split.data(), whole.data(), whole.size()), 1e-11) << ggml_type_name(t) << " experts, ks " << ks;
    }
  }
}

// Q4_0 read a block pair per lane (MatmulParams::q4_0_pairs) gives the two-lanes-per-block
// result up to f32 summation order: rows with a short last chunk (72 blocks: 64 + 8) and whole
// chunks (128; staged rows are 16-byte aligned, so a multiple of 8 blocks), one token, four
// (which keep two lanes per block) and five, the residual in place, grouped products, split
// rows and expert slots.
TEST(CudaKernels, Q4_0BlockPairsMatchTwoLanesPerBlock) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(59);
  for (int64_t n_in : {32 * 72, 32 * 128}) {
    for (int64_t n_tok : {1, 4, 5}) {  // 5: a four-token launch, then pairs at token offset 4
      for (int ks : {1, 2, 4}) {
        const int64_t n_out = 29;
        const auto x = random_floats(rng, n_in * n_tok), y0 = random_floats(rng, n_out * n_tok);
        Dev<float> dx(x), dact(x.size());
        Dev<uint8_t> w1(random_weights(rng, GgmlType::Q4_0, n_in, n_out).bytes),
            w2(random_weights(rng, GgmlType::Q4_0, n_in, n_out + 4).bytes);
        const auto run = [&](int pairs) {
          Dev<float> y1(y0), y2(static_cast<size_t>((n_out + 4) * n_tok));
          cuda::MatmulParams ps[2] = {mat_params(GgmlType::Q4_0, w1.p, n_in, n_out, dx.p, n_tok, y1.p),
                                      mat_params(GgmlType::Q4_0, w2.p, n_in, n_out + 4, dx.p, n_tok, y2.p)};
          ps[0].residual = y1.p;
          for (cuda::MatmulParams& p : ps) {
            p.act_round = dact.p;
            p.ksplit = ks;
            p.q4_0_pairs = pairs;
          }
          cuda::launch_matmuls(ps, 2);
          return std::make_pair(y1.get(), y2.get());
        };
        const auto lanes = run(0), pairs = run(1);
        EXPECT_LT(nmse(pairs.first.data(), lanes.first.data(), lanes.first.size()), 1e-11)
            << "n_in " << n_in << " n_tok " << n_tok << " ks " << ks;
        EXPECT_LT(nmse(pairs.second.data(), lanes.second.data(), lanes.second.size()), 1e-11)
            << "n_in " << n_in << " n_tok " << n_tok << " ks " << ks;
      }
    }
  }
  const int64_t n_in = 32 * 72, n_out = 21, n_expert = 3, k = 2, n_tok = 2;
  const std::vector<int32_t> ids = {1, 2, 0, 1};
  Dev<int32_t> dids(ids);
  const auto x = random_floats(rng, n_in * n_tok);
  Dev<float> dx(x), dact(x.size());
  Dev<uint8_t> dw(random_weights(rng, GgmlType::Q4_0, n_in, n_out * n_expert).bytes);
  const auto run = [&](int pairs) {
    Dev<float> dy(static_cast<size_t>(n_tok * k * n_out));
    cuda::MatmulParams p = mat_params(GgmlType::Q4_0, dw.p, n_in, n_out, dx.p, n_tok, dy.p);
    p.act_round = dact.p;
    p.slot_expert = dids.p;
    p.n_slots = n_tok * k;
    p.x_div = k;
    p.expert_bytes = ggml_row_bytes(GgmlType::Q4_0, n_in) * static_cast<size_t>(n_out);
    p.q4_0_pairs = pairs;
    cuda::launch_matmul(p);
    return dy.get();
  };
  const auto lanes = run(0), pairs = run(1);
  EXPECT_LT(nmse(pairs.data(), lanes.data(), lanes.size()), 1e-11) << "experts";
}

// Q4_0, Q8_0, Q4_K, Q5_K and Q6_K kept as the device keeps rows of whole 8-block groups (matmul.cuh,
// x8_type: reordered in place), and MXFP4 in 16-block groups, give the host's product on every
// path that reads them: the x8 decode kernel (one and four tokens, a bias, the residual, an odd
// last row pair, rows of 1 to 56 groups, so lanes whose blocks lie past a row's end; K-quant
// rows of 1 to 7 tiles; rows whose last group is partial, gpt-oss's 2880 among them), the
// generic kernel (no activation rounding) and cuBLAS over dequantized tiles (12 tokens); bounds
// as ActivationRoundingMatchesHostForEveryType's. (Expert slots: ExpertGridsOverOneWaveEqualPlainOnes.)
TEST(CudaKernels, X8LayoutsMatchHost) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(83);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  struct C {
    int64_t n_in, n_out, n_tok;
    bool bias, residual, round;
  };
  const std::vector<C> cases = {{256, 9, 1, false, false, true},     {4096, 40, 5, true, false, true},
                                {2304, 33, 4, false, true, true},     {14336, 24, 1, false, true, true},
                                {768, 20001, 1, false, false, true},  {512, 37, 12, true, false, true},
                                {4096, 17, 3, false, false, false},   {1024, 64, 8, false, false, true},
                                {2048, 21, 12, true, false, true},    {2048, 4001, 1, false, true, true},
                                {4096, 1001, 1, true, false, true},   {2880, 45, 1, true, true, true},
                                {544, 19, 4, false, false, true},     {2880, 30, 12, false, false, true},
                                {2880, 23, 3, false, false, false}};
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4}) {
    const GgmlType at = vec_dot_type(t);
    for (const C& c : cases) {
      if (cuda::x8_type(static_cast<int>(t), c.n_in) == static_cast<int>(t)) continue;  // kept as the file holds it
      const RandomWeights w = random_weights(rng, t, c.n_in, c.n_out);
      const auto x = random_floats(rng, c.n_in * c.n_tok), res = random_floats(rng, c.n_out * c.n_tok);
      const std::vector<float> xr = c.round ? host_rounded(at, x, c.n_in, c.n_tok) : x;
      const std::vector<float> ones(static_cast<size_t>(c.n_out), 1.0f);
      auto ref = reference_product(w.f, xr, c.n_in, c.n_out, c.n_tok, 1.0, c.bias ? ones.data() : nullptr);
      if (c.residual)
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += res[i];
      Dev<uint8_t> dw(device_rows(w.bytes, t, c.n_in));
      Dev<float> dx(x), db(ones), dy(c.residual ? res : std::vector<float>(ref.size())), dact(x.size());
      Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(c.n_in, c.n_tok)));
      cuda::MatmulParams p = mat_params(t, dw.p, c.n_in, c.n_out, dx.p, c.n_tok, dy.p);
      p.row_bytes = device_row(t, c.n_in);
      p.type = to_x8(t, dw.p, dw.n, c.n_in);
      p.bias = c.bias ? db.p : nullptr;
      p.residual = c.residual ? dy.p : nullptr;  // in place, as the backend adds it
      p.blas = blas;
      p.scratch = scratch.p;
      p.scratch_elems = scratch.n;
      p.act_round = c.round ? dact.p : nullptr;
      cuda::launch_matmul(p);
      const auto y = dy.get();
      EXPECT_LT(nmse(y.data(), ref.data(), ref.size()), c.n_tok <= cuda::kMatvecMaxTok ? 1e-9 : 1e-5)
          << ggml_type_name(t) << " n_in " << c.n_in << " n_out " << c.n_out << " n_tok " << c.n_tok;
    }
  }
  cublasDestroy(blas);
}

// The token embedding row taken on the device (a decode step run ahead, whose token is the
// previous step's pick) holds the host's bits: cpu::embedding_row's dequantization, then the
// embedding scale as cpu::embed_tokens multiplies, for every type the device decodes and for
// the x8 layouts a tied head's matrix is kept in.
TEST(CudaKernels, EmbedRowEqualsHostRowBitForBit) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(97);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                     GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
    for (const int64_t n : {int64_t{256}, int64_t{2304}, int64_t{4096}}) {
      const int64_t n_rows = 9;
      const RandomWeights w = random_weights(rng, t, n, n_rows);
      const size_t row_bytes = ggml_row_bytes(t, n);
      Dev<uint8_t> dw(w.bytes), dx8(device_rows(w.bytes, t, n));  // as the file holds them; padded
      int type = static_cast<int>(t);
      const bool x8 = cuda::x8_type(type, n) != type;
      for (int layout = 0; layout < (x8 ? 2 : 1); ++layout) {
        if (layout == 1) type = to_x8(t, dx8.p, dx8.n, n);
        for (const int32_t id : {0, 4, 8})
          for (const float scale : {0.0f, 45.25483f}) {
            Dev<int32_t> did(std::vector<int32_t>{id});
            Dev<float> dx(static_cast<size_t>(n));
            cuda::EmbedParams e;
            e.type = type;
            e.w = layout == 1 ? dx8.p : dw.p;
            e.row_bytes = layout == 1 ? device_row(t, n) : row_bytes;
            e.n = n;
            e.scale = scale;
            e.id = did.p;
            e.x = dx.p;
            cuda::launch_embed_row(e);
            std::vector<float> ref(w.f.begin() + id * n, w.f.begin() + (id + 1) * n);
            if (scale > 0.0f)
              for (float& v : ref) v *= scale;
            const auto x = dx.get();
            EXPECT_EQ(std::memcmp(x.data(), ref.data(), ref.size() * sizeof(float)), 0)
                << ggml_type_name(t) << " n " << n << " row " << id << " scale " << scale << (layout ? " x8" : "");
          }
      }
    }
  }
}

}  // namespace
}  // namespace frink::test

#endif  // FRINK_HAVE_CUDA
