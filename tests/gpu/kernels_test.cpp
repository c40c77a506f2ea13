// Every device kernel against its host body over a case table with odd sizes and tails.
// Bounds are NMSE against the host (or a double-precision reference where the host body
// itself rounds differently), each with its reason beside it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cpu/ops.h"
#include "engine/sampler.h"
#include "cuda/attention.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/embed.cuh"
#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "cuda/pick.cuh"
#include "cpu/moe.h"
#include "cuda/norm.cuh"
#include "cuda/occupancy.h"
#include "cuda/rope.cuh"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

struct MatCase {
  int64_t n_in, n_out, n_tok;
  bool bias;
};

// n_out random rows of type t (as the file would hold them) and their exact dequantization.
struct RandomWeights {
  std::vector<uint8_t> bytes;
  std::vector<float> f;
};
RandomWeights random_weights(std::mt19937& rng, GgmlType t, int64_t n_in, int64_t n_out) {
  RandomWeights w;
  w.f.resize(static_cast<size_t>(n_in * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    auto row = random_weight_row(rng, t, n_in);
    dequantize_row(t, row.data(), w.f.data() + r * n_in, n_in);
    w.bytes.insert(w.bytes.end(), row.begin(), row.end());
  }
  return w;
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
      std::vector<float> xr(x.size());
      std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(at, c.n_in)));
      for (int64_t tk = 0; tk < c.n_tok; ++tk) {
        quantize_row(at, x.data() + tk * c.n_in, q.data(), c.n_in);
        dequantize_row(at, q.data(), xr.data() + tk * c.n_in, c.n_in);
      }
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

// Rows [rows][n] of x normed into y (eps 1e-5).
cuda::NormParams norm_params(const float* x, float* y, int64_t n, int64_t rows, const float* w, const float* b,
                             bool layer) {
  cuda::NormParams p;
  p.x = x;
  p.x_stride = n;
  p.y = y;
  p.y_stride = n;
  p.n = n;
  p.n_rows = rows;
  p.w = w;
  p.b = b;
  p.eps = 1e-5f;
  p.layer_norm = layer;
  return p;
}

// A product whose input has a producer (MatmulParams::pre_norm / pre_glu): the separate path
// (the producer already ran into x1, then the product) against the fused one (set by `fuse`,
// writing x2): the inputs and the outputs must be equal bit for bit.
struct FusedCase {
  GgmlType t;
  const void* w;
  int64_t n_in, n_out, n_tok;
  cublasHandle_t blas;
  Dev<uint16_t>* scratch;
};
// x_kept false: the fused launch need not write x (a GLU before a cuBLAS F16 / BF16 product);
// it must then leave x2 as it was (poisoned).
void expect_producer_fused(const FusedCase& c, Dev<float>& x1, Dev<float>& x2,
                           const std::function<void(cuda::MatmulParams&)>& fuse, const std::string& where,
                           bool x_kept = true) {
  Dev<float> y1(static_cast<size_t>(c.n_out * c.n_tok)), y2(static_cast<size_t>(c.n_out * c.n_tok)),
      act1(static_cast<size_t>(c.n_in * c.n_tok)), act2(static_cast<size_t>(c.n_in * c.n_tok));
  cuda::MatmulParams p = mat_params(c.t, c.w, c.n_in, c.n_out, x1.p, c.n_tok, y1.p);
  p.blas = c.blas;
  p.scratch = c.scratch->p;
  p.scratch_elems = c.scratch->n;
  p.act_round = act1.p;
  cuda::launch_matmul(p);
  // The scratch poisoned (NaN in f16 and bf16): a producer that claimed x's 16-bit copy for a
  // cuBLAS product without writing it would otherwise pass on the first launch's copy.
  ASSERT_EQ(cudaMemset(c.scratch->p, 0xff, c.scratch->n * sizeof(uint16_t)), cudaSuccess);
  p.x = x2.p;
  p.y = y2.p;
  p.act_round = act2.p;
  fuse(p);
  const auto x2_before = x2.get();
  cuda::launch_matmul(p);
  EXPECT_EQ(x_kept ? x1.get() : x2_before, x2.get()) << where;
  EXPECT_EQ(y1.get(), y2.get()) << where;
}

// A norm handed to launch_matmuls (MatmulParams::pre_norm) gives the same bits as the norm
// launched first and the products after it: the fused norm + quantization kernels (Q4_0 and
// Q8_0: Q8_0 blocks; Q4_K and Q6_K: Q8_K blocks) must quantize exactly as the separate
// kernels (on prompt batches: that rounding as the f16 copy cuBLAS reads,
// launch_norm_blocks_16bit), F16 and BF16 decode batches round as act_round does in the norm's
// launch (launch_norm_round), their prompt batches get the 16-bit copy cuBLAS reads from it
// (launch_norm_16bit; the scratch poisoned first), and other types take the plain norm.
// Widths: 4096 (1024 threads), 2304 (576: nine 256-blocks of two warps each), 5120 (640
// threads, two slabs of float4 per thread), 1088 (320 threads, the last ones past the row; Q8_0
// blocks only).
TEST(CudaKernels, NormFusedWithPreparationEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(5120, 12)));  // the largest case's
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::BF16, GgmlType::F16,
                     GgmlType::F32})
    for (int64_t n_in : {4096, 2304, 5120, 1088})
      for (int64_t n_tok : {1, 3, 12})
        for (int mode : {0, 1, 2}) {  // RMS norm with weights, LayerNorm with bias, RMS norm alone
          if (n_in % ggml_type_info(t).block_elems != 0) continue;
          const bool layer = mode == 1;
          const int64_t n_out = 37;
          auto x = random_floats(rng, n_in * n_tok);
          // Mode 2 (no weight, so x's ties survive the norm): the largest magnitude twice in one
          // 256-block, in different warps of the fused Q8_K kernel, with opposite signs: the
          // scale must come from the first (element 10, +), as the separate kernel takes it.
          if (mode == 2) {
            x[10] = 50.0f;
            x[200] = -50.0f;
          }
          const auto w = random_floats(rng, n_in), b = random_floats(rng, n_in);
          Dev<float> dx(x), dw(w), db(b), dh1(x.size()), dh2(x.size());
          Dev<uint8_t> dwt(random_weights(rng, t, n_in, n_out).bytes);
          cuda::NormParams np =
              norm_params(dx.p, dh1.p, n_in, n_tok, mode == 2 ? nullptr : dw.p, layer ? db.p : nullptr, layer);
          cuda::launch_norm(np);  // separate: the norm, then the product
          np.y = dh2.p;
          expect_producer_fused(
              {t, dwt.p, n_in, n_out, n_tok, blas, &scratch}, dh1, dh2, [&](cuda::MatmulParams& p) { p.pre_norm = &np; },
              std::string(ggml_type_name(t)) + " n_in " + std::to_string(n_in) + " n_tok " + std::to_string(n_tok) +
                  " mode " + std::to_string(mode));
        }
  cublasDestroy(blas);
}

// A decode token's F32 router run in its norm's launch (launch_matmul_producer with a router,
// MoE decode): h and its Q8_0 / Q8_K blocks (BF16: its rounded copy) the same bits as the producer alone (the router's
// blocks must not disturb them), and the logits equal the norm followed by the F32 product to
// float rounding (the same h, another summation order) and the host's in double, so a scale
// or row offset wrong in both would still fail. Widths 2048 (512 threads), 4096 (1024), 1088
// (the last threads past the row), 2880 (gpt-oss's); routers of 128 and 60 rows, the 60 with a
// bias (gpt-oss's router has one).
TEST(CudaKernels, RouterInNormLaunchEqualsNormThenProduct) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(47);
  const int64_t most = std::min<int64_t>(128, cuda::sm_count() - 1);  // fewer rows than SMs
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::BF16})
    for (int64_t n_in : {2048, 4096, 1088, 2880})
      for (int64_t n_expert : {most, int64_t{60}}) {
        if (n_in % ggml_type_info(t).block_elems != 0 || (t == GgmlType::Q4_K && n_in % 256 != 0)) continue;
        const bool biased = n_expert == 60;
        const std::string where = std::string(ggml_type_name(t)) + " n_in " + std::to_string(n_in) + " experts " +
                                  std::to_string(n_expert);
        auto x = random_floats(rng, n_in, 30.0f);
        x[static_cast<size_t>(n_in - 1)] = 400.0f;  // the last thread's last element carries most of the sum
        const auto nw = random_floats(rng, n_in), wr = random_floats(rng, n_in * n_expert), rb = random_floats(rng, n_expert);
        Dev<float> dx(x), dnw(nw), dwr(wr), drb(rb), h1(x.size()), h2(x.size()), act1(x.size()), act2(x.size()),
            ref(static_cast<size_t>(n_expert)), out(static_cast<size_t>(n_expert));
        Dev<uint8_t> dwt(random_weights(rng, t, n_in, 64).bytes);
        cuda::NormParams np1 = norm_params(dx.p, h1.p, n_in, 1, dnw.p, nullptr, false), np2 = np1;
        np2.y = h2.p;
        cuda::MatmulParams p1 = mat_params(t, dwt.p, n_in, 64, h1.p, 1, nullptr), p2 = p1;
        p1.act_round = act1.p;
        p1.pre_norm = &np1;
        p2.x = h2.p;
        p2.act_round = act2.p;
        p2.pre_norm = &np2;
        cuda::RouterNormParams r;
        r.w = dwr.p;
        r.n_embd = n_in;
        r.n_expert = n_expert;
        r.logits = out.p;
        r.b = biased ? drb.p : nullptr;
        ASSERT_TRUE(cuda::norm_router_ok(p2, r)) << where;
        r.n_expert = cuda::sm_count();  // a row's block per SM: more rows keep their own launch
        EXPECT_FALSE(cuda::norm_router_ok(p2, r)) << where;
        r.n_expert = n_expert;
        const bool prepared1 = cuda::launch_matmul_producer(p1), prepared2 = cuda::launch_matmul_producer(p2, &r);
        EXPECT_TRUE(prepared1) << where;  // BF16: h rounded as its product reads it (launch_norm_round)
        EXPECT_EQ(prepared1, prepared2) << where;
        EXPECT_EQ(h1.get(), h2.get()) << where;
        if (prepared1) {
          const size_t bytes = t == GgmlType::BF16 ? n_in * sizeof(float) : cuda::matmul_q8_blocks_bytes(n_in, 1);
          std::vector<float> a1 = act1.get(), a2 = act2.get();
          EXPECT_EQ(std::memcmp(a1.data(), a2.data(), bytes), 0) << where;
        }
        cuda::MatmulParams pr = mat_params(GgmlType::F32, dwr.p, n_in, n_expert, h1.p, 1, ref.p);
        pr.bias = r.b;
        cuda::launch_matmul(pr);
        const auto lr = ref.get(), lo = out.get();
        EXPECT_LT(nmse(lo.data(), lr.data(), lr.size()), 1e-11) << where;
        double ss = 0.0;
        for (float v : x) ss += double{v} * v;
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n_in) + np1.eps);
        std::vector<float> host(static_cast<size_t>(n_expert));
        for (int64_t e = 0; e < n_expert; ++e) {
          double acc = 0.0;
          for (int64_t i = 0; i < n_in; ++i)
            acc += double{wr[static_cast<size_t>(e * n_in + i)]} * x[static_cast<size_t>(i)] * scale *
                   nw[static_cast<size_t>(i)];
          host[static_cast<size_t>(e)] = static_cast<float>(acc + (biased ? rb[static_cast<size_t>(e)] : 0.0f));
        }
        EXPECT_LT(nmse(lo.data(), host.data(), host.size()), 1e-10) << where;
      }
}

// A gated activation handed to launch_matmuls (MatmulParams::pre_glu) gives the same bits as
// launch_glu followed by the product: SiLU, GELU, gpt-oss's clamped form and gate-only, for
// the four dp4a types (fused on decode batches; on prompt batches x's Q8 / Q8_K rounding as the
// f16 copy cuBLAS reads, alone: launch_glu_blocks_16bit), F16 and BF16 (rounded in the GLU's
// launch on decode batches, launch_glu_round; on prompt batches its 16-bit copy alone, for
// cuBLAS: launch_glu_16bit), the scratch poisoned first, decode and prompt batches. With an up norm in
// groups of 128 and 256 (the gated delta net's output norm: GluParams::up_norm_w), launch_glu's
// output is also held to the host's arithmetic (a group norm then the GLU, in double).
TEST(CudaKernels, GluFusedWithPreparationEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(37);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  Dev<uint16_t> scratch(std::vector<uint16_t>(cuda::matmul_scratch_elems(2304, 12)));
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::BF16, GgmlType::F16})
    for (int64_t n_in : {768, 2304})
      for (int64_t n_tok : {1, 3, 12})
        for (int mode : {0, 1, 2, 3, 4, 5, 6}) {  // SiLU, GELU, clamped SwiGLU (oai), SiLU of the
                                                   // gate alone, SiLU of a fused gate|up row
                                                   // (stride 2 n), SiLU with up normed in groups
                                                   // of 128, of 256
          if (n_in % ggml_type_info(t).block_elems != 0) continue;
          const int64_t n_out = 29;
          const auto gate = random_floats(rng, 2 * n_in * n_tok), up = random_floats(rng, n_in * n_tok);
          Dev<float> dg(gate), du(up), dh1(static_cast<size_t>(n_in * n_tok)), dh2(static_cast<size_t>(n_in * n_tok));
          Dev<uint8_t> dwt(random_weights(rng, t, n_in, n_out).bytes);
          cuda::GluParams g;
          g.gate = dg.p;
          g.up = mode == 3 ? nullptr : mode == 4 ? dg.p + n_in : du.p;
          g.gate_stride = g.up_stride = mode == 4 ? 2 * n_in : n_in;
          g.n = n_in;
          g.n_tok = n_tok;
          g.gelu = mode == 1;
          g.oai = mode == 2;
          g.out = dh1.p;
          const int64_t gn = mode == 5 ? 128 : 256;
          const auto norm_w = random_floats(rng, gn);
          Dev<float> dnw(norm_w);
          if (mode >= 5) {
            g.up_norm_w = dnw.p;
            g.up_norm_n = gn;
            g.up_norm_eps = 1e-6f;
            ASSERT_TRUE(cuda::glu_norm_ok(g));
          }
          cuda::launch_glu(g);  // separate: the activation, then the product
          if (mode >= 5) {  // the host's group norm (rms_norm per head, then silu(z) * o)
            std::vector<float> host(static_cast<size_t>(n_in * n_tok));
            for (int64_t t = 0; t < n_tok; ++t)
              for (int64_t h = 0; h < n_in / gn; ++h) {
                const float* u = up.data() + t * n_in + h * gn;
                double ss = 0.0;
                for (int64_t i = 0; i < gn; ++i) ss += static_cast<double>(u[i]) * u[i];
                const double scale = 1.0 / std::sqrt(ss / static_cast<double>(gn) + 1e-6);
                for (int64_t i = 0; i < gn; ++i) {
                  const double z = gate[static_cast<size_t>(t * n_in + h * gn + i)];
                  host[static_cast<size_t>(t * n_in + h * gn + i)] =
                      static_cast<float>(z / (1.0 + std::exp(-z)) * u[i] * scale * norm_w[static_cast<size_t>(i)]);
                }
              }
            const auto dev = dh1.get();
            EXPECT_LT(nmse(dev.data(), host.data(), host.size()), 1e-12) << "mode " << mode << " n_in " << n_in;
          }
          g.out = dh2.p;
          // On cuBLAS the GLU writes x's f16 copy alone (the quantized types' with their Q8 /
          // Q8_K rounding; not with an up norm, whose launch keeps its values).
          const bool t16 = t == GgmlType::BF16 || t == GgmlType::F16;
          const bool copy_alone = n_tok > cuda::kMatvecMaxTok && (t16 || mode < 5);
          expect_producer_fused(
              {t, dwt.p, n_in, n_out, n_tok, blas, &scratch}, dh1, dh2, [&](cuda::MatmulParams& p) { p.pre_glu = &g; },
              std::string(ggml_type_name(t)) + " n_in " + std::to_string(n_in) + " n_tok " + std::to_string(n_tok) +
                  " mode " + std::to_string(mode),
              !copy_alone);
        }
  cublasDestroy(blas);
}

// x handed to launch_matmuls already quantized (MatmulParams::x_prepared: act_round filled by
// x's producer, here launch_matmul_producer's fused norm, as a MoE layer's FFN norm runs ahead
// of its router) gives the bits of the plain path, which quantizes x itself: one product; two
// of the type and a Q5_0 one after them (another preparation: it reads x's f32 values); and
// gate/up expert products in slot mode (x_div = k: the Q8_0 / Q8_K rows are per token). Q4_0
// and Q8_0 (Q8_0 blocks), Q4_K and Q6_K (Q8_K blocks), widths 4096 (one float4 slab a thread),
// 2304 (nine 256-blocks; Q6_K rows of 1890 bytes: the direct kernel) and 1088 (threads past the
// row; Q8_0 blocks only), 1 to 8 tokens. The moe_ffn buffer size (matmul_q8_blocks_bytes)
// holds either layout. A product that reads neither Q8 blocks nor a rounded copy refuses the
// flag before launching.
TEST(CudaKernels, PreparedInputEqualsQuantizingIt) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(59);
  const int64_t n_expert = 4, k = 2;
  const std::vector<int32_t> ids = {2, 0, 3, 2, 1, 1, 0, 3, 2, 1, 3, 0, 1, 2, 3, 0};  // 8 tokens x k
  Dev<int32_t> dids(ids);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
    for (int64_t n_in : {4096, 2304, 1088})
      for (int64_t n_tok : {1, 3, 8})
        for (int mode : {0, 1, 2}) {  // one product; two of t and a Q5_0 one; gate/up experts
          if (n_in % ggml_type_info(t).block_elems != 0) continue;
          const int n = mode == 0 ? 1 : mode == 1 ? 3 : 2;
          const bool experts = mode == 2;
          const std::string where = std::string(ggml_type_name(t)) + " n_in " + std::to_string(n_in) + " n_tok " +
                                    std::to_string(n_tok) + " mode " + std::to_string(mode);
          const auto x = random_floats(rng, n_in * n_tok);
          // act2 of the size moe_ffn gives its buffer (a Q5_0 product rounds x to f32 there: 4
          // bytes an element).
          const size_t q8_bytes = cuda::matmul_q8_blocks_bytes(n_in, n_tok);
          ASSERT_LE(q8_bytes, x.size() * sizeof(float)) << where;
          Dev<float> dx(x), dnw(random_floats(rng, n_in)), dh1(x.size()), dh2(x.size()), act1(x.size()),
              act2(mode == 1 ? x.size() : (q8_bytes + sizeof(float) - 1) / sizeof(float));
          std::vector<std::unique_ptr<Dev<uint8_t>>> ws;
          std::vector<std::unique_ptr<Dev<float>>> y1s, y2s;
          std::vector<cuda::MatmulParams> ps1, ps2;
          for (int i = 0; i < n; ++i) {
            const GgmlType ti = i == 2 ? GgmlType::Q5_0 : t;
            const int64_t n_out = 37 + 6 * i, n_rows = experts ? n_tok * k : n_tok;
            ws.push_back(std::make_unique<Dev<uint8_t>>(
                random_weights(rng, ti, n_in, n_out * (experts ? n_expert : 1)).bytes));
            y1s.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_rows * n_out)));
            y2s.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_rows * n_out)));
            cuda::MatmulParams p = mat_params(ti, ws.back()->p, n_in, n_out, dh1.p, n_tok, y1s.back()->p);
            p.act_round = act1.p;
            if (experts) {
              p.slot_expert = dids.p;
              p.n_slots = n_tok * k;
              p.x_div = k;
              p.expert_bytes = ggml_row_bytes(ti, n_in) * static_cast<size_t>(n_out);
            }
            ps1.push_back(p);
            p.x = dh2.p;
            p.y = y2s.back()->p;
            p.act_round = act2.p;
            ps2.push_back(p);
          }
          // Plain: the norm, then the products quantize its output.
          cuda::NormParams np = norm_params(dx.p, dh1.p, n_in, n_tok, dnw.p, nullptr, false);
          cuda::launch_norm(np);
          cuda::launch_matmuls(ps1.data(), n);
          // Prepared: the norm with the quantization, then the products told so.
          np.y = dh2.p;
          cuda::MatmulParams first = ps2[0];
          first.pre_norm = &np;
          ASSERT_TRUE(cuda::matmul_reads_q8_blocks(first)) << where;
          ASSERT_EQ(cuda::matmul_reads_q8_0(first), t == GgmlType::Q4_0 || t == GgmlType::Q8_0) << where;
          ASSERT_TRUE(cuda::launch_matmul_producer(first)) << where;
          ps2[0].x_prepared = true;
          cuda::launch_matmuls(ps2.data(), n);
          EXPECT_EQ(dh1.get(), dh2.get()) << where;
          for (int i = 0; i < n; ++i) EXPECT_EQ(y1s[static_cast<size_t>(i)]->get(), y2s[static_cast<size_t>(i)]->get())
                                          << where << " product " << i;
        }
  // F32 weights read x as it is, and Q5_0's rounded Q8_0 copy is no dp4a layout a producer
  // writes: the flag is a caller's bug. (BF16 decode products take it: the rounded copy,
  // AttentionMergeWritesRoundedOutput.)
  for (const GgmlType t : {GgmlType::F32, GgmlType::Q5_0}) {
    Dev<uint8_t> dw(random_weights(rng, t, 256, 8).bytes);
    Dev<float> dx(random_floats(rng, 256)), dy(8), dact(256);
    cuda::MatmulParams p = mat_params(t, dw.p, 256, 8, dx.p, 1, dy.p);
    p.act_round = dact.p;
    p.x_prepared = true;
    EXPECT_FALSE(cuda::matmul_reads_q8_blocks(p)) << ggml_type_name(t);
    EXPECT_FALSE(cuda::matmul_reads_rounded16(p)) << ggml_type_name(t);
    EXPECT_ANY_THROW(cuda::launch_matmul(p)) << ggml_type_name(t);
  }
}

// A NormFold (MatmulParams::fold_out / fold_in): the producer's y is its plain launch's bit for
// bit; the fold's quants and scales are the host's Q8_0 of w * y exactly (the scales before
// their f16 rounding) and its parts the 32-row sums of y^2; the products reading the fold equal
// the norm then the products within NMSE 1e-10: the same quants and scales but where 1/rms or
// the products before the scale-free rule round differently (a rare quant or f16 step, ~1e-8 /
// n_in). An f16 rounding of the scales before 1/rms scales them measured ~1e-7, a part dropped
// from 1/rms ~6e-5.
TEST(CudaKernels, NormFoldEqualsNormThenProducts) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(97);
  const float eps = 1e-5f;
  struct C {
    GgmlType t;
    int64_t n_prod_in, n;  // the producer's width, the residual's (the consumers' width)
  };
  for (const C c : {C{GgmlType::Q8_0, 512, 256}, C{GgmlType::Q8_0, 14336, 4096}, C{GgmlType::Q4_0, 2304, 2304},
                    C{GgmlType::Q4_0, 14336, 4096}}) {
    const std::string where = std::string(ggml_type_name(c.t)) + " " + std::to_string(c.n_prod_in) + " -> " +
                              std::to_string(c.n);
    const RandomWeights wp = random_weights(rng, c.t, c.n_prod_in, c.n);
    Dev<uint8_t> dwp(wp.bytes);
    const int tp = to_x8(c.t, dwp.p, wp.bytes.size(), c.n_prod_in);
    const auto hx = random_floats(rng, c.n_prod_in), res = random_floats(rng, c.n), nw = random_floats(rng, c.n);
    Dev<float> dhx(hx), dnw(nw), y1(res), y2(res), act(static_cast<size_t>(c.n_prod_in)), h1(static_cast<size_t>(c.n)),
        act1(static_cast<size_t>(c.n));
    Dev<uint8_t> fold_buf(std::vector<uint8_t>(cuda::norm_fold_bytes(c.n)));
    const cuda::NormFold fold = cuda::norm_fold_at(fold_buf.p, dnw.p, c.n, eps);
    cuda::MatmulParams pp = mat_params(c.t, dwp.p, c.n_prod_in, c.n, dhx.p, 1, y1.p);
    pp.type = tp;
    pp.act_round = act.p;
    pp.residual = y1.p;
    cuda::launch_matmul(pp);  // plain: y1 = res + W h
    pp.y = y2.p;
    pp.residual = y2.p;
    ASSERT_TRUE(cuda::matmul_folds_norm(pp)) << where;
    pp.fold_out = &fold;
    cuda::launch_matmul(pp);  // folded: y2 and the fold
    const auto y = y1.get();
    ASSERT_EQ(y, y2.get()) << where;
    // The fold against the host's Q8_0 of w * y and the sums of y^2.
    std::vector<float> wy(static_cast<size_t>(c.n));
    for (size_t i = 0; i < wy.size(); ++i) wy[i] = y[i] * nw[i];
    std::vector<uint8_t> hq(ggml_row_bytes(GgmlType::Q8_0, c.n));
    quantize_row(GgmlType::Q8_0, wy.data(), hq.data(), c.n);
    const auto fb = fold_buf.get();
    for (int64_t b = 0; b < c.n / 32; ++b) {
      uint16_t dh;
      std::memcpy(&dh, hq.data() + 34 * b, 2);
      float dd, part;
      std::memcpy(&dd, fb.data() + c.n + 4 * b, 4);
      std::memcpy(&part, fb.data() + c.n + 4 * (c.n / 32 + b), 4);
      ASSERT_EQ(f32_to_f16(dd), dh) << where << " block " << b;  // (the fold keeps it unrounded)
      ASSERT_EQ(0, std::memcmp(hq.data() + 34 * b + 2, fb.data() + 32 * b, 32)) << where << " block " << b;
      double ss = 0;
      for (int64_t i = 32 * b; i < 32 * b + 32; ++i) ss += double(y[static_cast<size_t>(i)]) * y[static_cast<size_t>(i)];
      ASSERT_NEAR(part, ss, 1e-5 * ss) << where << " block " << b;
    }
    // Consumers: a gate/up pair of the fold's width, after the norm or reading the fold.
    std::vector<std::unique_ptr<Dev<uint8_t>>> ws;
    std::vector<std::unique_ptr<Dev<float>>> c1, c2;
    std::vector<cuda::MatmulParams> ps1, ps2;
    for (int i = 0; i < 2; ++i) {
      const int64_t n_out = 96 + 32 * i;
      const RandomWeights wc = random_weights(rng, c.t, c.n, n_out);
      ws.push_back(std::make_unique<Dev<uint8_t>>(wc.bytes));
      const int tc = to_x8(c.t, ws.back()->p, wc.bytes.size(), c.n);
      ASSERT_TRUE(cuda::matmul_takes_folded_norm(tc, c.n, false)) << where;
      c1.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_out)));
      c2.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_out)));
      cuda::MatmulParams p = mat_params(c.t, ws.back()->p, c.n, n_out, h1.p, 1, c1.back()->p);
      p.type = tc;
      p.act_round = act1.p;
      ps1.push_back(p);
      p.y = c2.back()->p;
      ps2.push_back(p);
    }
    cuda::launch_norm(norm_params(y1.p, h1.p, c.n, 1, dnw.p, nullptr, false));
    cuda::launch_matmuls(ps1.data(), 2);
    cuda::read_norm_fold(ps2.data(), 2, fold);
    cuda::launch_matmuls(ps2.data(), 2);
    for (int i = 0; i < 2; ++i) {
      const auto a = c1[static_cast<size_t>(i)]->get(), b = c2[static_cast<size_t>(i)]->get();
      const double e = nmse(b.data(), a.data(), a.size());
      std::printf("[gpu] fold %-24s product %d nmse %.3g\n", where.c_str(), i, e);
      EXPECT_LT(e, 1e-10) << where << " product " << i;
    }
  }
  // A fold where its kernel does not take it fails before launching: Q4_0 rows of the narrow
  // kernel's width, a product without the residual.
  EXPECT_FALSE(cuda::matmul_takes_folded_norm(static_cast<int>(cuda::x8_type(static_cast<int>(GgmlType::Q4_0), 2048)),
                                              2048, false));
  EXPECT_FALSE(cuda::matmul_takes_folded_norm(static_cast<int>(cuda::x8_type(static_cast<int>(GgmlType::Q4_0), 4096)),
                                              4096, true));
  Dev<uint8_t> dw(random_weights(rng, GgmlType::Q8_0, 256, 32).bytes);
  const int t8 = to_x8(GgmlType::Q8_0, dw.p, dw.n, 256);
  Dev<float> dx(random_floats(rng, 256)), dy(32), dact(256), dnw(random_floats(rng, 32));
  Dev<uint8_t> fb(std::vector<uint8_t>(cuda::norm_fold_bytes(32)));
  const cuda::NormFold f = cuda::norm_fold_at(fb.p, dnw.p, 32, eps);
  cuda::MatmulParams p = mat_params(GgmlType::Q8_0, dw.p, 256, 32, dx.p, 1, dy.p);
  p.type = t8;
  p.act_round = dact.p;
  EXPECT_FALSE(cuda::matmul_folds_norm(p));
  p.fold_out = &f;
  EXPECT_ANY_THROW(cuda::launch_matmul(p));
}

// The attention merge's rounded output for an F16 / BF16 wo (AttnParams::out_round): the bits
// the product's own act_round launch writes from the merge's f32 output, which is the same with
// and without it; a wo product that takes them (x_prepared) equals one that rounds x itself. A
// prefill batch (no merge) or out_round beside out_q8 fails before launching.
TEST(CudaKernels, AttentionMergeWritesRoundedOutput) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(67);
  struct MergeCase {
    int64_t n_tok, pos0, n_head, n_head_kv, hd, max_keys;
  };
  const MergeCase cases[] = {{1, 700, 32, 8, 128, 4096}, {3, 300, 8, 1, 128, 0}, {1, 130, 4, 4, 64, 0},
                             {1, 5000, 32, 8, 128, 65536}};  // the last: the merge's wide blocks
  for (const GgmlType wt : {GgmlType::BF16, GgmlType::F16})
    for (const MergeCase& c : cases) {
      const std::string where = std::string(ggml_type_name(wt)) + " n_tok " + std::to_string(c.n_tok) + " hd " +
                                std::to_string(c.hd);
      const int64_t n_keys = c.pos0 + c.n_tok, kw = c.n_head_kv * c.hd, n_in = c.n_head * c.hd, n_x = c.n_tok * n_in;
      const int64_t max_keys = c.max_keys ? c.max_keys : n_keys, n_out = 24;
      Dev<float> dq(random_floats(rng, n_x)), dk(random_floats(rng, n_keys * kw)), dv(random_floats(rng, n_keys * kw)),
          part(cuda::attn_scratch_floats(c.n_tok, max_keys, c.n_head, c.n_head_kv, c.hd, c.hd)), out1(static_cast<size_t>(n_x)),
          out2(static_cast<size_t>(n_x)), dround(static_cast<size_t>(n_x)), act(static_cast<size_t>(n_x)),
          y1(static_cast<size_t>(c.n_tok * n_out)), y2(static_cast<size_t>(c.n_tok * n_out));
      Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(c.pos0)});
      cuda::AttnParams p =
          attn_params(dq.p, dk.p, dv.p, out1.p, part.p, c.n_tok, dpos.p, max_keys, c.n_head, c.n_head_kv, c.hd);
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      cuda::launch_attention(p);
      p.out = out2.p;
      p.out_round = dround.p;
      p.out_round_bf16 = wt == GgmlType::BF16;
      cuda::launch_attention(p);
      EXPECT_EQ(out1.get(), out2.get()) << where;
      Dev<uint8_t> dw(random_weights(rng, wt, n_in, n_out).bytes);
      cuda::MatmulParams m = mat_params(wt, dw.p, n_in, n_out, out2.p, c.n_tok, y1.p);
      m.act_round = act.p;
      ASSERT_TRUE(cuda::matmul_reads_rounded16(m)) << where;
      cuda::launch_matmul(m);
      EXPECT_EQ(dround.get(), act.get()) << where;  // the product's own rounding of the same values
      m.act_round = dround.p;
      m.y = y2.p;
      m.x_prepared = true;
      cuda::launch_matmul(m);
      EXPECT_EQ(y1.get(), y2.get()) << where;
    }
  Dev<int32_t> dpos(std::vector<int32_t>{0});
  Dev<float> dqkv(static_cast<size_t>(8 * 64)), dout(static_cast<size_t>(8 * 64)), dpart(size_t{4096}),
      dround(static_cast<size_t>(8 * 64)), dd8(static_cast<size_t>(8 * 64 / 32));
  Dev<int8_t> dq8(std::vector<int8_t>(8 * 64, 0));
  for (const auto& [n_tok, with_q8] : {std::pair<int64_t, bool>{8, false}, {1, true}}) {
    cuda::AttnParams p = attn_params(dqkv.p, dqkv.p, dqkv.p, dout.p, dpart.p, n_tok, dpos.p, n_tok, 1, 1, 64);
    p.out_round = dround.p;
    if (with_q8) {
      p.out_q8 = dq8.p;
      p.out_d8 = dd8.p;
    }
    EXPECT_ANY_THROW(cuda::launch_attention(p)) << "n_tok " << n_tok << " with out_q8 " << with_q8;
  }
}

// The attention merge's Q8_0 and Q8_K output (AttnParams::out_q8, out_sum): quants, scales
// (and Q8_K's sums) are the bits the product's own quantization (launch_matmul's for Q8_0 and
// Q4_K weights) writes from the merge's f32 output; that output is the same with and without
// them; and a wo product that takes the blocks (x_prepared) equals one that quantizes. Decode
// and 3-token batches, head dims 64, 128 and 256 (Q8_K: 4, 2 and 1 heads a merge block),
// groups of 1 to 8, 1 to 16 live splits in grids of up to 64, even splits behind grids of
// 65536 keys (the merge's wide blocks), sinks, and a KV head whose V
// rows are zero (all-zero Q8_0 blocks: scale 0, quants 0). A prefill batch (tiled kernels) or
// a head dim the blocks would straddle fails before launching.
TEST(CudaKernels, AttentionMergeWritesQ8BlocksOfItsOutput) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(61);
  struct MergeCase {
    int64_t n_tok, pos0, n_head, n_head_kv, hd, max_keys;
    bool sinks;
  };
  const MergeCase cases[] = {
      {1, 0, 8, 2, 64, 0, false},         // 1 key, one split
      {1, 700, 32, 8, 128, 4096, false},  // 11 live splits in a grid of 64 (a token graph's)
      {3, 300, 8, 1, 128, 0, false},      // group 8, queries across a split edge
      {3, 1000, 16, 4, 64, 2048, true},   // 16 splits, sinks
      {1, 130, 4, 4, 128, 0, false},      // group 1, 3 splits
      {1, 200, 4, 2, 256, 0, true},       // one head a Q8_K block, sinks
      // even splits (grids of 65536 keys): the merge's wide blocks, up to 1024 threads
      {1, 5000, 32, 8, 128, 65536, false},  // Q8_K: 2 heads a block, 16 warps each
      {1, 3000, 32, 8, 64, 65536, true},    // Q8_K: 4 heads a block, 8 warps each; sinks
      {1, 9000, 4, 2, 256, 65536, false},   // Q8_K: 1 head a block, 32 warps
  };
  for (const bool q8k : {false, true})
    for (const MergeCase& c : cases) {
      const std::string where = std::string(q8k ? "Q8_K" : "Q8_0") + " n_tok " + std::to_string(c.n_tok) + " pos0 " +
                                std::to_string(c.pos0) + " heads " + std::to_string(c.n_head) + "/" +
                                std::to_string(c.n_head_kv) + " hd " + std::to_string(c.hd);
      ASSERT_TRUE(q8k ? cuda::attn_writes_q8k(c.n_tok, c.hd, c.hd, c.n_head) : cuda::attn_writes_q8_0(c.n_tok, c.hd, c.hd))
          << where;
      const int64_t n_keys = c.pos0 + c.n_tok, kw = c.n_head_kv * c.hd, n_in = c.n_head * c.hd, n_x = c.n_tok * n_in;
      const int64_t max_keys = c.max_keys ? c.max_keys : n_keys, n_d = q8k ? n_x / 256 : n_x / 32;
      auto v = random_floats(rng, n_keys * kw);
      for (int64_t j = 0; j < n_keys; ++j) std::fill_n(v.begin() + j * kw, c.hd, 0.0f);  // KV head 0's values
      Dev<float> dq(random_floats(rng, n_x)), dk(random_floats(rng, n_keys * kw)), dv(v),
          dsinks(random_floats(rng, c.n_head, 2.0f)), part(cuda::attn_scratch_floats(c.n_tok, max_keys, c.n_head, c.n_head_kv, c.hd, c.hd)),
          out1(static_cast<size_t>(n_x)), out2(static_cast<size_t>(n_x)), dd8(static_cast<size_t>(n_d));
      Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(c.pos0)}),
          dsum(std::vector<int32_t>(static_cast<size_t>(n_x / 32), 12345));
      Dev<int8_t> dq8(std::vector<int8_t>(static_cast<size_t>(n_x), 0x55));
      cuda::AttnParams p =
          attn_params(dq.p, dk.p, dv.p, out1.p, part.p, c.n_tok, dpos.p, max_keys, c.n_head, c.n_head_kv, c.hd);
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      p.sinks = c.sinks ? dsinks.p : nullptr;
      cuda::launch_attention(p);
      p.out = out2.p;
      p.out_q8 = dq8.p;
      p.out_d8 = dd8.p;
      p.out_sum = q8k ? dsum.p : nullptr;
      cuda::launch_attention(p);
      EXPECT_EQ(out1.get(), out2.get()) << where;
      // The product's own quantization of the merge's output, left in its act_round: the int8
      // quants, then the f32 scales (then Q8_K's int32 sums).
      const int64_t n_out = 24;
      const GgmlType wt = q8k ? GgmlType::Q4_K : GgmlType::Q8_0;
      Dev<uint8_t> dw(random_weights(rng, wt, n_in, n_out).bytes);
      Dev<float> act1(static_cast<size_t>(n_x)), act2(static_cast<size_t>(n_x)), y1(static_cast<size_t>(c.n_tok * n_out)),
          y2(static_cast<size_t>(c.n_tok * n_out));
      cuda::MatmulParams m = mat_params(wt, dw.p, n_in, n_out, out2.p, c.n_tok, y1.p);
      m.act_round = act1.p;
      ASSERT_EQ(cuda::matmul_reads_q8_0(m), !q8k) << where;
      ASSERT_TRUE(cuda::matmul_reads_q8_blocks(m)) << where;
      cuda::launch_matmul(m);
      const auto a = act1.get();
      const auto* bytes = reinterpret_cast<const int8_t*>(a.data());
      std::vector<int8_t> q_ref(static_cast<size_t>(n_x));
      std::vector<float> d_ref(static_cast<size_t>(n_d));
      std::vector<int32_t> sum_ref(static_cast<size_t>(n_x / 32));
      std::memcpy(q_ref.data(), bytes, q_ref.size());
      std::memcpy(d_ref.data(), bytes + n_x, d_ref.size() * sizeof(float));
      EXPECT_EQ(dq8.get(), q_ref) << where;
      EXPECT_EQ(dd8.get(), d_ref) << where;
      if (q8k) {
        std::memcpy(sum_ref.data(), bytes + n_x + n_d * 4, sum_ref.size() * sizeof(int32_t));
        EXPECT_EQ(dsum.get(), sum_ref) << where;
      }
      // wo taking the merge's blocks as they lie in its act_round (cuda::q8_0_act / q8k_act).
      m.act_round = act2.p;
      if (q8k) {
        const cuda::Q8KAct blocks = cuda::q8k_act(m);
        ASSERT_EQ(cudaMemcpy(blocks.q, dq8.p, q_ref.size(), cudaMemcpyDeviceToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(blocks.d, dd8.p, d_ref.size() * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(blocks.sum, dsum.p, sum_ref.size() * sizeof(int32_t), cudaMemcpyDeviceToDevice),
                  cudaSuccess);
      } else {
        const cuda::Q8_0Act blocks = cuda::q8_0_act(m);
        ASSERT_EQ(cudaMemcpy(blocks.q, dq8.p, q_ref.size(), cudaMemcpyDeviceToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(blocks.d, dd8.p, d_ref.size() * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
      }
      m.y = y2.p;
      m.x_prepared = true;
      cuda::launch_matmul(m);
      EXPECT_EQ(y1.get(), y2.get()) << where;
    }
  EXPECT_FALSE(cuda::attn_writes_q8k(8, 64, 64, 4));     // prefill
  EXPECT_FALSE(cuda::attn_writes_q8k(1, 96, 96, 8));     // 256-blocks would straddle heads
  EXPECT_FALSE(cuda::attn_writes_q8k(1, 128, 128, 3));   // the last block would be half a head pair
  // Shapes the merge cannot serve: the caller asked attn_writes_q8_0; launching anyway fails.
  EXPECT_FALSE(cuda::attn_writes_q8_0(8, 64, 64));  // prefill: the tiled kernel, no merge
  EXPECT_FALSE(cuda::attn_writes_q8_0(1, 48, 48));  // blocks would straddle heads
  Dev<int32_t> dpos(std::vector<int32_t>{0});
  Dev<float> dqkv(static_cast<size_t>(8 * 64)), dout(static_cast<size_t>(8 * 64)), dpart(size_t{4096}),
      dd8(static_cast<size_t>(8 * 64 / 32));
  Dev<int8_t> dq8(std::vector<int8_t>(8 * 64, 0));
  Dev<int32_t> dsum(std::vector<int32_t>(8 * 64 / 32, 0));
  // (n_tok, head dim, Q8_K): prefill; a Q8_0 block straddling heads; one head of 64 for a
  // 256-block.
  for (const auto& [n_tok, hd, q8k] : {std::tuple<int64_t, int64_t, bool>{8, 64, false}, {1, 48, false}, {1, 64, true}}) {
    cuda::AttnParams p = attn_params(dqkv.p, dqkv.p, dqkv.p, dout.p, dpart.p, n_tok, dpos.p, n_tok, 1, 1, hd);
    p.out_q8 = dq8.p;
    p.out_d8 = dd8.p;
    p.out_sum = q8k ? dsum.p : nullptr;
    EXPECT_ANY_THROW(cuda::launch_attention(p)) << "n_tok " << n_tok << " hd " << hd << " q8k " << q8k;
  }
}

// Two norms in one launch (a layer's per-head q and k norms, in place) write what two
// launches write, bit for bit; widths that differ or do not vectorise take two launches.
TEST(CudaKernels, NormPairEqualsTwoNorms) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(61);
  struct C {
    int64_t n1, rows1, n2, rows2;
  };
  for (const C& c : {C{128, 32 * 3, 128, 4 * 3}, C{64, 8, 64, 2}, C{256, 5, 256, 1}, C{128, 4, 64, 2}, C{37, 3, 37, 2}}) {
    const auto x1 = random_floats(rng, c.n1 * c.rows1), x2 = random_floats(rng, c.n2 * c.rows2);
    const auto w1 = random_floats(rng, c.n1), w2 = random_floats(rng, c.n2);
    Dev<float> dw1(w1), dw2(w2);
    const auto run = [&](bool pair) {
      Dev<float> d1(x1), d2(x2);
      const cuda::NormParams a = norm_params(d1.p, d1.p, c.n1, c.rows1, dw1.p, nullptr, false);
      const cuda::NormParams b = norm_params(d2.p, d2.p, c.n2, c.rows2, dw2.p, nullptr, false);
      if (pair) {
        cuda::launch_norm_pair(a, b);
      } else {
        cuda::launch_norm(a);
        cuda::launch_norm(b);
      }
      return std::make_pair(d1.get(), d2.get());
    };
    const auto two = run(false), one = run(true);
    EXPECT_EQ(one.first, two.first) << "n " << c.n1 << " rows " << c.rows1;
    EXPECT_EQ(one.second, two.second) << "n " << c.n2 << " rows " << c.rows2;
    EXPECT_NE(one.first, x1);  // it normed something
  }
}

// A sandwich norm with the residual add in its launch (NormParams::residual, in place on the
// residual as the layer runs it) writes what the norm then launch_add write, bit for bit:
// the float4 body and the scalar loop, RMSNorm and LayerNorm, one row and a batch.
TEST(CudaKernels, NormWithResidualEqualsNormThenAdd) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(67);
  for (int64_t n : {3840, 37})
    for (bool layer : {false, true})
      for (int64_t rows : {1, 5}) {
        const auto x = random_floats(rng, n * rows), res = random_floats(rng, n * rows);
        const auto w = random_floats(rng, n), b = random_floats(rng, n);
        Dev<float> dx(x), dw(w), db(b), dy(x.size()), sum_two(res), sum_one(res);
        cuda::launch_norm(norm_params(dx.p, dy.p, n, rows, dw.p, layer ? db.p : nullptr, layer));
        cuda::launch_add(sum_two.p, sum_two.p, dy.p, nullptr, n * rows, nullptr);
        cuda::NormParams q = norm_params(dx.p, sum_one.p, n, rows, dw.p, layer ? db.p : nullptr, layer);
        q.residual = sum_one.p;
        cuda::launch_norm(q);
        const auto one = sum_one.get(), two = sum_two.get();
        EXPECT_EQ(one, two) << "n " << n << " layer " << layer << " rows " << rows;
        EXPECT_NE(one, res);  // it added something
      }
}

TEST(CudaKernels, NormsMatchHost) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(3);
  // Widths a multiple of 4 take the float4 kernel with 1 to 4 float4 per thread (128 .. 16384);
  // the others (and 16388, past its registers) the scalar loop.
  for (int64_t n : {37, 64, 128, 255, 4096, 4099, 12288, 16384, 16388})
    for (bool layer : {false, true})
      for (int64_t rows : {1, 5}) {
        const auto x = random_floats(rng, n * rows), w = random_floats(rng, n), b = random_floats(rng, n);
        std::vector<float> ref(x.size());
        for (int64_t r = 0; r < rows; ++r) {
          if (layer)
            cpu::layer_norm(x.data() + r * n, w.data(), b.data(), ref.data() + r * n, n, 1e-5f);
          else
            cpu::rms_norm(x.data() + r * n, w.data(), ref.data() + r * n, n, 1e-5f);
        }
        Dev<float> dx(x), dw(w), db(b), dy(x.size());
        cuda::launch_norm(norm_params(dx.p, dy.p, n, rows, dw.p, layer ? db.p : nullptr, layer));
        const auto y = dy.get();
        // f32 sums (host: double) over <= 16388 terms: ~1e-13; bound 1e-10.
        EXPECT_LT(nmse(y.data(), ref.data(), ref.size()), 1e-10) << "n " << n << " layer " << layer;
      }
}

TEST(CudaKernels, RopeMatchesHost) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(5);
  struct C {
    RopeKind kind;
    int64_t head_dim, n_rot, pos0;
    bool ff, yarn;
    bool truncate = true;  // YaRN ramp ends floored/ceiled (false: gpt-oss's fractional ends)
  };
  for (const C& c : {C{RopeKind::kNorm, 64, 64, 0, false, false}, C{RopeKind::kNeox, 128, 128, 4090, false, false},
                     C{RopeKind::kNeox, 80, 40, 17, false, false}, C{RopeKind::kNorm, 128, 128, 9000, true, false},
                     C{RopeKind::kNeox, 64, 64, 300, false, true}, C{RopeKind::kNeox, 64, 64, 300, false, true, false}}) {
    const int64_t n_head = 3, n_tok = 4;
    RopeParams rp;
    rp.kind = c.kind;
    rp.n_rot = c.n_rot;
    rp.freq_base = 500000.0f;
    if (c.yarn) {
      rp.ext_factor = 1.0f;
      rp.freq_scale = 0.25f;
      rp.n_ctx_orig = 4096;
      rp.yarn_truncate = c.truncate;
    }
    std::vector<float> ff(static_cast<size_t>(c.n_rot / 2));
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.1f * static_cast<float>(i);
    // x (3 heads a row) and a second tensor x2 (2 heads in rows of 3 heads' width) in one launch.
    const int64_t n_head2 = 2;
    auto x = random_floats(rng, n_tok * n_head * c.head_dim), x2 = random_floats(rng, n_tok * n_head * c.head_dim);
    std::vector<float> ref = x, ref2 = x2;
    for (int64_t t = 0; t < n_tok; ++t) {
      cpu::rope(rp, c.ff ? ff.data() : nullptr, ref.data() + t * n_head * c.head_dim, n_head, c.head_dim, c.pos0 + t);
      cpu::rope(rp, c.ff ? ff.data() : nullptr, ref2.data() + t * n_head * c.head_dim, n_head2, c.head_dim, c.pos0 + t);
    }
    Dev<float> dx(x), dx2(x2), dff(ff);
    Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(c.pos0)});  // positions live on the device
    cuda::RopeLaunch p;
    p.x = dx.p;
    p.row_stride = n_head * c.head_dim;
    p.n_tok = n_tok;
    p.n_head = n_head;
    p.head_dim = c.head_dim;
    p.pos = dpos.p;
    p.n_rot = c.n_rot;
    p.neox = c.kind == RopeKind::kNeox;
    p.freq_base = rp.freq_base;
    p.freq_scale = rp.freq_scale;
    p.ext_factor = rp.ext_factor;
    p.attn_factor = rp.attn_factor;
    p.beta_fast = rp.beta_fast;
    p.beta_slow = rp.beta_slow;
    p.n_ctx_orig = rp.n_ctx_orig;
    p.yarn_truncate = rp.yarn_truncate;
    p.freq_factors = c.ff ? dff.p : nullptr;
    p.x2 = dx2.p;
    p.row_stride2 = n_head * c.head_dim;
    p.n_head2 = n_head2;
    cuda::launch_rope(p);
    const auto y = dx.get(), y2 = dx2.get();
    // Same angle arithmetic as the host; cosf/sinf differ from glibc by ~1 ulp, times the
    // angle (up to ~9000 rad) before range reduction: ~1e-12 expected, bound 1e-9. The third
    // head of each x2 row is not x2's: it must come back untouched.
    EXPECT_LT(nmse(y.data(), ref.data(), ref.size()), 1e-9) << "head_dim " << c.head_dim << " pos0 " << c.pos0;
    EXPECT_LT(nmse(y2.data(), ref2.data(), ref2.size()), 1e-9) << "x2: head_dim " << c.head_dim;
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const size_t i = static_cast<size_t>((t * n_head + n_head2) * c.head_dim + d);
        EXPECT_EQ(y2[i], x2[i]);
      }
  }
}

TEST(CudaKernels, GluAddSoftcapMatchHost) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (bool gelu : {false, true}) {
    const int64_t n = 173, n_tok = 3;
    const auto g = random_floats(rng, n * n_tok, 3.0f), u = random_floats(rng, n * n_tok);
    std::vector<float> ref = g;
    if (gelu)
      cpu::gelu_tanh_inplace(ref.data(), n * n_tok);
    else
      cpu::silu_inplace(ref.data(), n * n_tok);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] *= u[i];
    Dev<float> dg(g), du(u), dy(ref.size());
    cuda::GluParams p;
    p.gate = dg.p;
    p.up = du.p;
    p.gate_stride = p.up_stride = n;
    p.out = dy.p;
    p.n = n;
    p.n_tok = n_tok;
    p.gelu = gelu;
    cuda::launch_glu(p);
    const auto y = dy.get();
    EXPECT_LT(nmse(y.data(), ref.data(), ref.size()), 1e-11) << "gelu " << gelu;  // ulp-level expf/tanhf
  }
  const auto a = random_floats(rng, 1001, 40.0f);
  std::vector<float> ref = a;
  cpu::softcap_inplace(ref.data(), 1001, 30.0f);
  Dev<float> da(a);
  cuda::launch_softcap(da.p, 1001, 30.0f, nullptr);
  const auto y = da.get();
  EXPECT_LT(nmse(y.data(), ref.data(), ref.size()), 1e-11);
}

// MoE routing on the device = the host's route_token (chosen experts exactly, weights to
// float rounding) for each gating, with a selection bias, weight normalisation and scale,
// over expert counts that do and do not fill the warp's lanes; ties (logits rounded to whole
// numbers: equal scores, the lower expert first) and experts of -inf logit; k from 2 to 24 (a
// slot a lane at the routing's end, route_token), with lanes holding 16 experts (512, 300, 257);
// group-limited routing (DeepSeek-V3's 8 groups of 32, 4 kept; groups of 16 and of 10 that cut
// across a lane's experts; 32 groups of 2; ties between groups' scores).
TEST(CudaKernels, RoutingMatchesHost) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(41);
  struct C {
    ExpertGating gating;
    int64_t n_expert, k;
    bool bias, norm_w;
    float w_scale;
    bool ties = false;
    int64_t n_group = 0, n_group_used = 0;
  };
  for (const C& c : {C{ExpertGating::kSoftmax, 128, 8, false, true, 1.0f}, C{ExpertGating::kSoftmax, 8, 2, false, false, 1.0f},
                     C{ExpertGating::kSigmoid, 256, 8, true, true, 2.5f}, C{ExpertGating::kSoftmaxWeight, 32, 4, false, false, 1.0f},
                     C{ExpertGating::kSoftmax, 60, 4, false, false, 1.0f}, C{ExpertGating::kSoftmax, 512, 10, true, true, 1.0f},
                     C{ExpertGating::kSoftmax, 128, 8, false, true, 1.0f, true},
                     C{ExpertGating::kSigmoid, 60, 6, false, false, 1.0f, true},
                     C{ExpertGating::kSoftmax, 512, 10, false, true, 1.0f, true},
                     C{ExpertGating::kSigmoid, 300, 16, true, false, 1.0f, true},
                     C{ExpertGating::kSoftmaxWeight, 257, 24, false, false, 1.0f},
                     C{ExpertGating::kSigmoid, 256, 8, true, true, 2.5f, false, 8, 4},
                     C{ExpertGating::kSoftmax, 64, 6, false, false, 1.0f, false, 4, 2},
                     C{ExpertGating::kSigmoid, 60, 4, true, true, 1.0f, true, 6, 1},
                     C{ExpertGating::kSoftmax, 64, 6, false, true, 1.0f, true, 32, 5},
                     C{ExpertGating::kSigmoid, 160, 8, false, true, 1.0f, true, 8, 3}}) {
    const int64_t n_tok = 5;
    auto logits = random_floats(rng, n_tok * c.n_expert, 2.0f);
    const auto bias = random_floats(rng, c.n_expert, 0.1f);
    if (c.ties) {
      for (auto& v : logits) v = std::round(v);
      for (int64_t e = 0; e < c.n_expert; e += 7) logits[static_cast<size_t>(e)] = -INFINITY;  // token 0
    }
    MoePlan mp;
    mp.n_expert = c.n_expert;
    mp.n_expert_used = c.k;
    mp.gating = c.gating;
    mp.norm_w = c.norm_w;
    mp.w_scale = c.w_scale;
    mp.n_group = c.n_group;
    mp.n_group_used = c.n_group_used;
    std::vector<int32_t> ref_e(static_cast<size_t>(n_tok * c.k));
    std::vector<float> ref_w(ref_e.size());
    for (int64_t t = 0; t < n_tok; ++t) {
      std::vector<float> lg(logits.begin() + t * c.n_expert, logits.begin() + (t + 1) * c.n_expert);
      cpu::route_token(mp, lg.data(), c.bias ? bias.data() : nullptr, ref_e.data() + t * c.k, ref_w.data() + t * c.k);
    }
    Dev<float> dl(logits), db(bias), dw(ref_w.size());
    Dev<int32_t> de(std::vector<int32_t>(ref_e.size(), -1));
    cuda::RouteParams p;
    p.logits = dl.p;
    p.sel_bias = c.bias ? db.p : nullptr;
    p.n_tok = n_tok;
    p.n_expert = c.n_expert;
    p.k = c.k;
    p.gating = static_cast<int>(c.gating);
    p.norm_w = c.norm_w;
    p.w_scale = c.w_scale;
    p.n_group = static_cast<int>(c.n_group);
    p.n_group_used = static_cast<int>(c.n_group_used);
    p.expert = de.p;
    p.weight = dw.p;
    cuda::launch_route(p);
    EXPECT_EQ(de.get(), ref_e) << "n_expert " << c.n_expert << " groups " << c.n_group;
    if (c.n_group > 1) {  // the masking changed the choice somewhere, or the case tests nothing
      MoePlan open = mp;
      open.n_group = 0;
      std::vector<int32_t> free_e(ref_e.size());
      std::vector<float> free_w(ref_e.size());
      for (int64_t t = 0; t < n_tok; ++t) {
        std::vector<float> lg(logits.begin() + t * c.n_expert, logits.begin() + (t + 1) * c.n_expert);
        cpu::route_token(open, lg.data(), c.bias ? bias.data() : nullptr, free_e.data() + t * c.k,
                         free_w.data() + t * c.k);
      }
      EXPECT_NE(free_e, ref_e) << "groups " << c.n_group << ": no token's choice was limited";
    }
    const auto w = dw.get();
    EXPECT_LT(nmse(w.data(), ref_w.data(), ref_w.size()), 1e-12) << "n_expert " << c.n_expert;
    // A stacked shared expert (RouteParams::n_shared): when gated, the router's rows gain the
    // shared gate's logit as column n_expert; slots k + n_shared a token, the first k as above,
    // slot k + j expert n_expert + j, each weighted sigmoid(gate) (gated) or 1. Three slots: a
    // shared expert three routed ones wide (DeviceLayer::shexp_slots).
    const auto gate = random_floats(rng, n_tok, 3.0f);
    std::vector<float> wide;
    for (int64_t t = 0; t < n_tok; ++t) {
      wide.insert(wide.end(), logits.begin() + t * c.n_expert, logits.begin() + (t + 1) * c.n_expert);
      wide.push_back(gate[static_cast<size_t>(t)]);
    }
    for (const auto& [n_shared, gated] :
         {std::pair{1, false}, std::pair{1, true}, std::pair{3, true}, std::pair{2, false}}) {
      const int64_t ks = c.k + n_shared;
      const std::string what = "shared " + std::to_string(n_shared) + (gated ? " gated" : "");
      Dev<float> dwide(gated ? wide : logits), dws(static_cast<size_t>(n_tok * ks));
      Dev<int32_t> des(std::vector<int32_t>(static_cast<size_t>(n_tok * ks), -1));
      cuda::RouteParams q = p;
      q.logits = dwide.p;
      q.n_shared = n_shared;
      q.shared_gated = gated;
      q.expert = des.p;
      q.weight = dws.p;
      cuda::launch_route(q);
      const auto e2 = des.get();
      const auto w2 = dws.get();
      for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t j = 0; j < c.k; ++j) {
          EXPECT_EQ(e2[static_cast<size_t>(t * ks + j)], ref_e[static_cast<size_t>(t * c.k + j)]) << what;
          EXPECT_NEAR(w2[static_cast<size_t>(t * ks + j)], ref_w[static_cast<size_t>(t * c.k + j)], 1e-6f);
        }
        const float v = gate[static_cast<size_t>(t)];
        for (int j = 0; j < n_shared; ++j) {
          EXPECT_EQ(e2[static_cast<size_t>(t * ks + c.k + j)], c.n_expert + j) << what;
          EXPECT_NEAR(w2[static_cast<size_t>(t * ks + c.k + j)], gated ? 1.0f / (1.0f + std::exp(-v)) : 1.0f, 1e-6f)
              << what;
        }
      }
    }
  }
}

// Expert products (slot_expert): each slot's row equals a plain product with that expert's
// matrix, bias and scale, bit for bit (the same kernel and activation preparation), for
// gate/up (slots share token rows, x_div = k) and down (a row per slot), on each kernel family.
TEST(CudaKernels, ExpertProductsEqualPlainOnes) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(43);
  const int64_t n_expert = 6, n_in = 512, n_out = 40, n_tok = 3, k = 2;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::F16, GgmlType::MXFP4}) {
    for (int64_t x_div : {k, int64_t{1}}) {
      const int64_t n_slots = n_tok * k, n_rows = n_slots / x_div;
      const RandomWeights w = random_weights(rng, t, n_in, n_out * n_expert);
      const auto x = random_floats(rng, n_rows * n_in), b = random_floats(rng, n_expert * n_out),
                 sc = random_floats(rng, n_expert);
      const std::vector<int32_t> ids = {3, 0, 5, 3, 1, 2};
      Dev<uint8_t> dw(w.bytes);
      Dev<float> dx(x), db(b), dsc(sc), dy(static_cast<size_t>(n_slots * n_out)), dact(x.size()),
          dy1(static_cast<size_t>(n_out));
      Dev<int32_t> dids(ids);
      cuda::MatmulParams p = mat_params(t, dw.p, n_in, n_out, dx.p, n_rows, dy.p);
      p.bias = db.p;
      p.act_round = dact.p;
      p.slot_expert = dids.p;
      p.n_slots = n_slots;
      p.x_div = x_div;
      p.expert_bytes = ggml_row_bytes(t, n_in) * static_cast<size_t>(n_out);
      p.expert_scale = dsc.p;
      cuda::launch_matmul(p);
      const auto y = dy.get();
      for (int64_t s = 0; s < n_slots; ++s) {
        const int32_t e = ids[static_cast<size_t>(s)];
        cuda::MatmulParams q = mat_params(t, static_cast<const uint8_t*>(dw.p) + e * p.expert_bytes, n_in, n_out,
                                          dx.p + (s / x_div) * n_in, 1, dy1.p);
        q.bias = db.p + e * n_out;
        q.scale = sc[static_cast<size_t>(e)];
        q.act_round = dact.p;
        cuda::launch_matmul(q);
        const auto y1 = dy1.get();
        const std::vector<float> row(y.begin() + s * n_out, y.begin() + (s + 1) * n_out);
        EXPECT_EQ(row, y1) << ggml_type_name(t) << " slot " << s << " x_div " << x_div;
      }
    }
  }
}

// Expert grids of more than one wave of resident blocks (qwen3-30b-a3b's gate/up: 2048 in,
// 768 out, 8 experts a token) are cut to one wave whose warps walk a second row pair
// (matvec.cu one_wave_x): each slot's rows still equal a plain product with its expert, bit
// for bit. 8 to 24 slots put the grid (1536 to 4608 blocks) in (one wave, two] for any device
// holding 768 to 3072 blocks at once (an H200: ~1320). The same for the x8 layouts' kernel
// (matvec_reg_kernel, one warp per row pair; Q4_0, Q4_K, Q5_K and Q6_K; Q4_0's rows of 2048 and 768,
// the down's width, on matvec_narrow_kernel's sub-warps of 16 and 8 lanes), and with a bias and
// expert scales on up.
TEST(CudaKernels, ExpertGridsOverOneWaveEqualPlainOnes) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(67);
  const int64_t n_expert = 16, n_out = 768, k = 8;
  Dev<float> db(random_floats(rng, n_expert * n_out)), dsc(random_floats(rng, n_expert));
  const auto sc = dsc.get();
  // Q4_0 as the file holds it (the stream kernel), and Q4_0, Q4_K, Q5_K and Q6_K as the device
  // keeps them (x8_type).
  struct L {
    GgmlType t;
    bool x8;
    int64_t n_in;
  };
  // Rows of partial groups too: Q4_0's 1408 (DeepSeek-V2's expert down, on the narrow kernel) and
  // MXFP4's 2880 (gpt-oss's), padded as the device keeps them.
  const L layouts[] = {{GgmlType::Q4_0, false, 2048}, {GgmlType::Q4_0, true, 2048}, {GgmlType::Q4_0, true, 768},
                       {GgmlType::Q4_K, true, 2048},  {GgmlType::Q5_K, true, 2048}, {GgmlType::Q6_K, true, 2048},
                       {GgmlType::Q4_0, true, 1408},  {GgmlType::MXFP4, true, 2880}};
  for (const auto& [t, x8, n_in] : layouts) {
    const size_t row_bytes = x8 ? device_row(t, n_in) : ggml_row_bytes(t, n_in);
    const size_t expert_bytes = row_bytes * static_cast<size_t>(n_out);
    auto gb = random_weights(rng, t, n_in, n_out * n_expert).bytes, ub = random_weights(rng, t, n_in, n_out * n_expert).bytes;
    if (x8) {
      gb = device_rows(gb, t, n_in);
      ub = device_rows(ub, t, n_in);
    }
    Dev<uint8_t> dg(gb), du(ub);
    const int type = x8 ? to_x8(t, dg.p, gb.size(), n_in) : static_cast<int>(t);
    if (x8) to_x8(t, du.p, ub.size(), n_in);
    for (int c = 0; c < 6; ++c) {
      const int64_t n_tok = 1 + c / 2;
      const bool settled = c % 2 == 1;  // MatmulParams::slots_settled: the slots read before the wait
      const int64_t n_slots = n_tok * k;
      const auto x = random_floats(rng, n_tok * n_in);
      std::vector<int32_t> ids(static_cast<size_t>(n_slots));
      for (auto& e : ids) e = static_cast<int32_t>(rng() % n_expert);
      Dev<float> dx(x), dact(x.size()), dyg(static_cast<size_t>(n_slots * n_out)),
          dyu(static_cast<size_t>(n_slots * n_out)), dy1(static_cast<size_t>(n_out));
      Dev<int32_t> dids(ids);
      cuda::MatmulParams ps[2] = {mat_params(t, dg.p, n_in, n_out, dx.p, n_tok, dyg.p),
                                  mat_params(t, du.p, n_in, n_out, dx.p, n_tok, dyu.p)};
      for (cuda::MatmulParams& p : ps) {
        p.type = type;
        p.row_bytes = row_bytes;
        p.act_round = dact.p;
        p.slot_expert = dids.p;
        p.n_slots = n_slots;
        p.x_div = k;
        p.expert_bytes = expert_bytes;
        p.slots_settled = settled;
      }
      ps[1].bias = db.p;  // the epilogue's path (the gate's is the plain store)
      ps[1].expert_scale = dsc.p;
      cuda::launch_matmuls(ps, 2);
      for (int i = 0; i < 2; ++i) {
        const auto y = (i == 0 ? dyg : dyu).get();
        for (int64_t s = 0; s < n_slots; ++s) {
          const int32_t e = ids[static_cast<size_t>(s)];
          cuda::MatmulParams q = mat_params(t, static_cast<const uint8_t*>(i == 0 ? dg.p : du.p) + e * expert_bytes,
                                            n_in, n_out, dx.p + (s / k) * n_in, 1, dy1.p);
          q.type = type;
          q.row_bytes = row_bytes;
          q.act_round = dact.p;
          if (i == 1) {
            q.bias = db.p + e * n_out;
            q.scale = sc[static_cast<size_t>(e)];
          }
          cuda::launch_matmul(q);
          const std::vector<float> row(y.begin() + s * n_out, y.begin() + (s + 1) * n_out);
          ASSERT_EQ(row, dy1.get()) << ggml_type_name(t) << " x8 " << x8 << " n_in " << n_in << " product " << i
                                    << " slots " << n_slots << " slot " << s << " settled " << settled;
        }
      }
    }
  }
}

// The experts' gate/up launch that routes its token itself (MatmulParams::route) gives the
// routing kernel's experts and weights, and launch_route's products, bit for bit: 128, 64 and
// 60 experts (4 keys a lane, a lane's last empty), a softmax and a sigmoid gate with a
// selection bias, a stacked shared expert (slot k, the router's extra logit; or slots k and
// k + 1, one two routed ones wide), and group-limited routing (8 groups, 3 kept), on both
// narrow kernels. 512 experts route in their own kernel (kRouteInLaunchMaxExperts).
TEST(CudaKernels, RoutingInExpertLaunchEqualsRouteThenProducts) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(71);
  struct C {
    GgmlType t;
    int64_t n_in, n_out, n_expert, k;
    ExpertGating gating;
    int n_shared;  // stacked shared expert's slots
    bool shared_gated = false;
    int n_group = 0, n_group_used = 0;
  };
  // matvec_narrow_kernel's sub-warps of 16 (2048 wide) and 8 lanes (768).
  for (const C& c : {C{GgmlType::Q4_0, 2048, 768, 128, 8, ExpertGating::kSoftmax, 0},
                     C{GgmlType::Q4_0, 2048, 768, 60, 4, ExpertGating::kSigmoid, 0},
                     C{GgmlType::Q4_0, 2048, 768, 64, 6, ExpertGating::kSoftmax, 1, true},
                     C{GgmlType::Q4_0, 2048, 768, 64, 6, ExpertGating::kSoftmax, 2, true},
                     C{GgmlType::Q4_0, 768, 2048, 128, 8, ExpertGating::kSoftmax, 1},
                     C{GgmlType::Q4_0, 2048, 768, 64, 6, ExpertGating::kSigmoid, 0, false, 8, 3}}) {
    const int64_t n_in = c.n_in, n_out = c.n_out;
    const int64_t stack = c.n_expert + c.n_shared, slots = c.k + c.n_shared;
    const size_t expert_bytes = ggml_row_bytes(c.t, n_in) * static_cast<size_t>(n_out);
    const auto gb = random_weights(rng, c.t, n_in, n_out * stack).bytes, ub = random_weights(rng, c.t, n_in, n_out * stack).bytes;
    Dev<uint8_t> dg(gb), du(ub);
    const int type = to_x8(c.t, dg.p, gb.size(), n_in);
    to_x8(c.t, du.p, ub.size(), n_in);
    ASSERT_NE(type, static_cast<int>(c.t)) << ggml_type_name(c.t) << " " << n_in;
    Dev<float> dl(random_floats(rng, c.n_expert + c.shared_gated, 2.0f)), dbias(random_floats(rng, c.n_expert, 0.1f));
    Dev<float> dx(random_floats(rng, n_in)), dact(static_cast<size_t>(n_in));
    std::vector<std::vector<float>> ys[2];
    std::vector<int32_t> experts[2];
    std::vector<float> weights[2];
    for (int fused = 0; fused < 2; ++fused) {
      Dev<int32_t> de(std::vector<int32_t>(static_cast<size_t>(slots), -1));
      Dev<float> dw(static_cast<size_t>(slots)), dyg(static_cast<size_t>(slots * n_out)), dyu(static_cast<size_t>(slots * n_out));
      cuda::RouteParams r;
      r.logits = dl.p;
      r.sel_bias = c.gating == ExpertGating::kSigmoid ? dbias.p : nullptr;
      r.n_tok = 1;
      r.n_expert = c.n_expert;
      r.k = c.k;
      r.gating = static_cast<int>(c.gating);
      r.norm_w = true;
      r.n_shared = c.n_shared;
      r.shared_gated = c.shared_gated;
      r.n_group = c.n_group;
      r.n_group_used = c.n_group_used;
      r.expert = de.p;
      r.weight = dw.p;
      cuda::MatmulParams ps[2] = {mat_params(c.t, dg.p, n_in, n_out, dx.p, 1, dyg.p),
                                  mat_params(c.t, du.p, n_in, n_out, dx.p, 1, dyu.p)};
      for (cuda::MatmulParams& p : ps) {
        p.type = type;
        p.act_round = dact.p;
        p.slot_expert = de.p;
        p.n_slots = slots;
        p.x_div = slots;
        p.expert_bytes = expert_bytes;
      }
      ASSERT_TRUE(cuda::matmul_routes_in_launch(ps[0], r));
      cuda::RouteParams wide = r;
      wide.n_expert = cuda::kRouteInLaunchMaxExperts + 1;
      EXPECT_FALSE(cuda::matmul_routes_in_launch(ps[0], wide));
      cuda::MatmulParams two_tok = ps[0];
      two_tok.n_tok = 2;
      EXPECT_FALSE(cuda::matmul_routes_in_launch(two_tok, r));
      if (fused) ps[0].route = &r;
      else cuda::launch_route(r);
      cuda::launch_matmuls(ps, 2);
      ys[fused] = {dyg.get(), dyu.get()};
      experts[fused] = de.get();
      weights[fused] = dw.get();
    }
    const std::string what = std::string(ggml_type_name(c.t)) + " n_in " + std::to_string(n_in) + " n_expert " +
                             std::to_string(c.n_expert);
    EXPECT_EQ(experts[1], experts[0]) << what;
    EXPECT_EQ(weights[1], weights[0]) << what;
    EXPECT_EQ(ys[1], ys[0]) << what;
    if (c.n_shared) {
      EXPECT_EQ(experts[1].back(), c.n_expert + c.n_shared - 1) << what;
    }
  }
}

// The experts' down of one token with the combine in its launch (MatmulParams::combine_w)
// gives the slots' down products then launch_moe_combine, bit for bit. Q4_0 x8 rows on
// sub-warps of 8 lanes (768 wide: 2 row pairs a block of 4 warps at k 8, one at 16, 5 at 3 with
// one sub-warp idle) and of 16 (2048 wide, 8 warps at k 12); K-quant rows as qwen3-next's downs
// (Q4_K / Q6_K 512 wide, 11 slots: 8 and 16 lanes, 4 and 8 warps; Q4_K 1024, Q5_K); Q4_0 rows of
// 1408 (DeepSeek-V2's down, 8 slots with its shared expert's two; a partial last group); an odd row
// count (a last row pair of one row), no residual, a residual of its own and one aliasing the
// output, and the same expert in two slots. Launches it cannot take are refused by
// matmul_combines_in_launch.
TEST(CudaKernels, CombineInExpertDownEqualsDownThenCombine) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(73);
  struct C {
    GgmlType t;
    int64_t n_in, n_out, k;
    int lanes;  // the sub-warp the launch takes: at most 32 (8 lanes) or 16 (16) slots
  };
  const int64_t n_expert = 20;
  for (const C& c : {C{GgmlType::Q4_0, 768, 2048, 8, 8}, C{GgmlType::Q4_0, 768, 1001, 16, 8},
                     C{GgmlType::Q4_0, 768, 512, 3, 8}, C{GgmlType::Q4_0, 2048, 768, 8, 16},
                     C{GgmlType::Q4_0, 2048, 301, 5, 16}, C{GgmlType::Q4_0, 2048, 130, 12, 16},
                     C{GgmlType::Q4_K, 512, 2048, 11, 8}, C{GgmlType::Q6_K, 512, 1001, 11, 16},
                     C{GgmlType::Q4_K, 1024, 300, 10, 16}, C{GgmlType::Q5_K, 512, 64, 3, 8},
                     C{GgmlType::Q4_0, 1408, 2048, 8, 16}}) {
    const bool x8 = c.t == GgmlType::Q4_0;  // rows as the device keeps them (1408: padded to whole groups)
    const size_t row_bytes = x8 ? device_row(c.t, c.n_in) : ggml_row_bytes(c.t, c.n_in);
    const size_t expert_bytes = row_bytes * static_cast<size_t>(c.n_out);
    auto wb = random_weights(rng, c.t, c.n_in, c.n_out * n_expert).bytes;
    if (x8) wb = device_rows(wb, c.t, c.n_in);
    Dev<uint8_t> dwt(wb);
    const int type = x8 ? to_x8(c.t, dwt.p, wb.size(), c.n_in) : static_cast<int>(c.t);
    std::vector<int32_t> ids(static_cast<size_t>(c.k));
    for (auto& e : ids) e = static_cast<int32_t>(rng() % n_expert);
    ids.back() = ids.front();
    const auto x = random_floats(rng, c.k * c.n_in), w = random_floats(rng, c.k), res = random_floats(rng, c.n_out);
    Dev<int32_t> dids(ids);
    Dev<float> dx(x), dact(x.size() * 2), dw(w), dys(static_cast<size_t>(c.k * c.n_out));
    cuda::MatmulParams down = mat_params(c.t, dwt.p, c.n_in, c.n_out, dx.p, c.k, dys.p);
    down.type = type;
    down.row_bytes = row_bytes;
    down.act_round = dact.p;
    down.slot_expert = dids.p;
    down.n_slots = c.k;
    down.expert_bytes = expert_bytes;
    down.slots_settled = true;
    const std::string what = std::string(ggml_type_name(c.t)) + " n_in " + std::to_string(c.n_in) + " n_out " +
                             std::to_string(c.n_out) + " k " + std::to_string(c.k);
    for (int mode = 0; mode < 3; ++mode) {  // no residual, a residual of its own, in place
      Dev<float> dref(res), dout(res), dr(res);
      cuda::launch_matmul(down);
      cuda::CombineParams cp;
      cp.y = dys.p;
      cp.weight = dw.p;
      cp.n_tok = 1;
      cp.k = c.k;
      cp.n_embd = c.n_out;
      cp.residual = mode == 0 ? nullptr : mode == 1 ? dr.p : dref.p;
      cp.out = dref.p;
      cuda::launch_moe_combine(cp);
      cuda::MatmulParams comb = down;
      comb.combine_w = dw.p;
      comb.y = dout.p;
      comb.y_stride = c.n_out;
      comb.residual = mode == 0 ? nullptr : mode == 1 ? dr.p : dout.p;
      ASSERT_TRUE(cuda::matmul_combines_in_launch(comb)) << what;
      cuda::launch_matmul(comb);
      EXPECT_EQ(dout.get(), dref.get()) << what << " mode " << mode;
    }
    cuda::MatmulParams no = down;
    no.combine_w = dw.p;
    EXPECT_TRUE(cuda::matmul_combines_in_launch(no)) << what;
    no.slots_settled = false;
    EXPECT_FALSE(cuda::matmul_combines_in_launch(no)) << what;
    no = down;
    no.combine_w = dw.p;
    no.bias = dw.p;
    EXPECT_FALSE(cuda::matmul_combines_in_launch(no)) << what;
    no = down;
    no.combine_w = dw.p;
    no.n_slots = no.n_tok = 17;  // more slots than a block's 16 sub-warps
    EXPECT_FALSE(cuda::matmul_combines_in_launch(no)) << what;
    no = down;
    no.combine_w = dw.p;
    no.type = static_cast<int>(GgmlType::Q8_0);
    EXPECT_FALSE(cuda::matmul_combines_in_launch(no)) << what;
  }
  // Q6_K rows of 1024 need 32 lanes: past the narrow kernels.
  cuda::MatmulParams q6 = mat_params(GgmlType::Q6_K, nullptr, 1024, 64, nullptr, 4, nullptr);
  q6.slot_expert = reinterpret_cast<const int32_t*>(&q6);
  q6.n_slots = 4;
  q6.slots_settled = true;
  q6.act_round = reinterpret_cast<float*>(&q6);
  q6.combine_w = q6.act_round;
  EXPECT_FALSE(cuda::matmul_combines_in_launch(q6));
  q6.n_in = 512;
  EXPECT_TRUE(cuda::matmul_combines_in_launch(q6));
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

// A MoE layer's gate and up expert products in one launch (launch_matmuls groups products of
// one routing) equal the same products launched alone, bit for bit: each product's rows come
// from the slot's expert of its own stack, with its own bias and scale, into its own output.
TEST(CudaKernels, GroupedExpertProductsEqualSeparateOnes) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(47);
  const int64_t n_expert = 5, n_in = 512, n_tok = 3, k = 2, n_slots = n_tok * k;
  const std::vector<int32_t> ids = {4, 0, 2, 4, 1, 3};
  Dev<int32_t> dids(ids);
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::BF16};
  for (int c = 0; c < 3 * 6; ++c) {
    // Rows split over 1, 2 and 4 warps too (ksplit): the second product's slot store after the split.
    const GgmlType t = types[c / 3];
    const int ks = 1 << (c % 3);
    const auto x = random_floats(rng, n_tok * n_in);
    Dev<float> dx(x), dact(x.size());
    std::vector<std::unique_ptr<Dev<uint8_t>>> ws;
    std::vector<std::unique_ptr<Dev<float>>> bs, scs, ys_group, ys_alone;
    std::vector<cuda::MatmulParams> ps;
    for (int i = 0; i < 2; ++i) {
      const int64_t n_out = 37 + 6 * i;  // odd and different: the second product's rows start mid-block
      ws.push_back(std::make_unique<Dev<uint8_t>>(random_weights(rng, t, n_in, n_out * n_expert).bytes));
      bs.push_back(std::make_unique<Dev<float>>(random_floats(rng, n_expert * n_out)));
      scs.push_back(std::make_unique<Dev<float>>(random_floats(rng, n_expert)));
      ys_group.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_slots * n_out)));
      ys_alone.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n_slots * n_out)));
      cuda::MatmulParams p = mat_params(t, ws.back()->p, n_in, n_out, dx.p, n_tok, ys_group.back()->p);
      p.bias = bs.back()->p;
      p.act_round = dact.p;
      p.slot_expert = dids.p;
      p.n_slots = n_slots;
      p.x_div = k;
      p.expert_bytes = ggml_row_bytes(t, n_in) * static_cast<size_t>(n_out);
      p.expert_scale = scs.back()->p;
      p.ksplit = ks;
      ps.push_back(p);
    }
    cuda::launch_matmuls(ps.data(), 2);
    for (size_t i = 0; i < ps.size(); ++i) {
      cuda::MatmulParams p = ps[i];
      p.y = ys_alone[i]->p;
      cuda::launch_matmul(p);
    }
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(ys_group[i]->get(), ys_alone[i]->get()) << ggml_type_name(t) << " product " << i << " ks " << ks;
  }
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
      std::vector<float> xr(x.size());
      if (c.round) {
        std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(at, c.n_in)));
        for (int64_t tk = 0; tk < c.n_tok; ++tk) {
          quantize_row(at, x.data() + tk * c.n_in, q.data(), c.n_in);
          dequantize_row(at, q.data(), xr.data() + tk * c.n_in, c.n_in);
        }
      } else {
        xr = x;
      }
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

// The weighted sum of the chosen experts' outputs (+ the gated shared expert, + residual in
// place) in the host's order of operations; k = 20 also takes the slots past the ones the
// kernel loads up front (kCombineLoads).
TEST(CudaKernels, MoeCombineMatchesHostOrder) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(47);
  for (const int64_t k : {4, 8, 20}) {
    const int64_t n_tok = 3, E = 96;
    const auto y = random_floats(rng, n_tok * k * E), w = random_floats(rng, n_tok * k),
               sh = random_floats(rng, n_tok * E), g = random_floats(rng, n_tok, 2.0f), r = random_floats(rng, n_tok * E);
    std::vector<float> ref(static_cast<size_t>(n_tok * E));
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t d = 0; d < E; ++d) {
        float o = y[(t * k) * E + d] * w[t * k];
        for (int64_t j = 1; j < k; ++j) o += y[(t * k + j) * E + d] * w[t * k + j];
        const float v = g[t];
        o += sh[t * E + d] * (v / (1.0f + std::exp(-v)) / v);
        ref[t * E + d] = r[t * E + d] + o;
      }
    Dev<float> dy(y), dw(w), dsh(sh), dg(g), dr(r);
    cuda::CombineParams p;
    p.y = dy.p;
    p.weight = dw.p;
    p.n_tok = n_tok;
    p.k = k;
    p.n_embd = E;
    p.shared = dsh.p;
    p.shared_gate = dg.p;
    p.residual = dr.p;
    p.out = dr.p;
    cuda::launch_moe_combine(p);
    const auto out = dr.get();
    // f32 on both sides; the device may contract a multiply-add into an FMA: 1e-12.
    EXPECT_LT(nmse(out.data(), ref.data(), ref.size()), 1e-12) << "k " << k;
  }
}

// Penalties and top-k on the device = the host sampler's: the llama.cpp penalty formula on
// the listed tokens (bit for bit), then sampling::top_k's candidates and order (value
// descending, id ascending), over vocabularies below, at and above the kernels' chunking,
// with ties at the cut and -inf logits.
TEST(CudaKernels, PenaltiesAndTopKMatchTheHostSampler) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(53);
  for (int64_t n : {100, 1024, 1025, 32000, 151936, 300000}) {  // 300000: more lists than merge threads
    for (int k : {1, 40, 99, 256}) {
      if (k >= n) continue;
      auto l = random_floats(rng, n, 2.0f);
      l[static_cast<size_t>(n / 2)] = l[static_cast<size_t>(n / 3)] = 7.5f;  // a tie near the top
      // A run of equal values wider than k, so the cut falls inside a tie (ids decide), and
      // two -inf, one of which is in the top 99 of 100.
      for (int64_t i = 10; i < std::min<int64_t>(n - 2, 10 + k + 5); ++i) l[static_cast<size_t>(i)] = 6.0f;
      l[static_cast<size_t>(n - 1)] = l[static_cast<size_t>(n - 2)] = -INFINITY;
      cuda::PickDev pd{};
      pd.repeat = 1.3f;
      pd.frequency = 0.25f;
      pd.presence = 0.5f;
      std::vector<float> ref = l;
      for (int i = 0; i < 60; ++i) {
        const int32_t id = static_cast<int32_t>((i * 7919) % n);
        bool dup = false;
        for (int j = 0; j < pd.n_pen; ++j) dup |= pd.pen[2 * j] == id;
        if (dup) continue;
        pd.pen[2 * pd.n_pen] = id;
        pd.pen[2 * pd.n_pen + 1] = 1 + i % 4;
        float& v = ref[static_cast<size_t>(id)];
        v = sampling::penalized(v, 1 + i % 4, pd.repeat, pd.frequency, pd.presence);  // the host's own
        ++pd.n_pen;
      }
      std::vector<TokenLogit> want;
      for (int64_t i = 0; i < n; ++i) want.push_back({static_cast<int32_t>(i), ref[static_cast<size_t>(i)]});
      sampling::top_k(want, k);
      Dev<float> dl(l);
      Dev<uint8_t> dpick(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&pd),
                                              reinterpret_cast<const uint8_t*>(&pd) + sizeof(pd)));
      Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, k)));
      Dev<int32_t> ids(std::vector<int32_t>(static_cast<size_t>(k), -1));
      Dev<float> vals(static_cast<size_t>(k));
      cuda::launch_penalties(dl.p, reinterpret_cast<const cuda::PickDev*>(dpick.p), nullptr, nullptr);
      EXPECT_EQ(dl.get(), ref) << "penalties, n " << n;
      cuda::launch_topk(dl.p, n, k, scratch.p, ids.p, vals.p, nullptr);
      const auto gi = ids.get();
      const auto gv = vals.get();
      for (int r = 0; r < k; ++r) {
        EXPECT_EQ(gi[static_cast<size_t>(r)], want[static_cast<size_t>(r)].id) << "n " << n << " k " << k << " rank " << r;
        EXPECT_EQ(gv[static_cast<size_t>(r)], want[static_cast<size_t>(r)].logit) << "n " << n << " k " << k << " rank " << r;
      }
    }
  }
}

// A step enqueued ahead penalises over the window of the step before it with its own token
// entering (PickDev::entering) and the oldest leaving: the host's formula on the counts that
// window has, bit for bit. The token new to the window, or listed; the one leaving down to
// zero (no penalty left), or down by one; the same token entering and leaving; nothing
// leaving; a full list of kPickMaxPenalties with a new token entering.
TEST(CudaKernels, PenaltiesOfAStepAheadTakeItsTokenEntering) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(61);
  const int64_t n = 151936;
  struct Case {
    int n_list, entering, leaving;
  };
  // The list: ids 100 * i + 7 (then + 13 and + 26 past 1500 entries), counts 1 + i % 3 (so id 7
  // has count 1, 107 count 2, 207 count 3).
  const Case cases[] = {{60, 5, 7}, {60, 307, 107}, {60, 207, 207}, {60, 5, -1}, {60, 407, -1},
                        {cuda::kPickMaxPenalties, 5, 7}, {0, 5, -1}};
  for (const Case& c : cases) {
    const auto l = random_floats(rng, n, 2.0f);
    auto pd = std::make_unique<cuda::PickDev>();
    pd->n_pen = c.n_list;
    pd->entering = 1;
    pd->leaving = c.leaving;
    pd->repeat = 1.3f;
    pd->frequency = 0.25f;
    pd->presence = 0.5f;
    std::map<int32_t, int> counts;
    for (int i = 0; i < c.n_list; ++i) {
      const int32_t id = 7 + 100 * (i % 1500) + 13 * (i / 1500);
      ASSERT_EQ(counts.count(id), 0u);
      pd->pen[2 * i] = id;
      pd->pen[2 * i + 1] = 1 + i % 3;
      counts[id] = 1 + i % 3;
    }
    ++counts[c.entering];
    if (c.leaving >= 0 && --counts[c.leaving] == 0) counts.erase(c.leaving);
    std::vector<float> ref = l;
    for (const auto& [id, count] : counts) {
      float& v = ref[static_cast<size_t>(id)];
      v = sampling::penalized(v, count, pd->repeat, pd->frequency, pd->presence);
    }
    Dev<float> dl(l);
    Dev<uint8_t> dpick(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(pd.get()),
                                            reinterpret_cast<const uint8_t*>(pd.get()) + sizeof(cuda::PickDev)));
    Dev<int32_t> token(std::vector<int32_t>{c.entering});
    cuda::launch_penalties(dl.p, reinterpret_cast<const cuda::PickDev*>(dpick.p), token.p, nullptr);
    EXPECT_EQ(dl.get(), ref) << "list " << c.n_list << ", entering " << c.entering << ", leaving " << c.leaving;
  }
}

// Top-k where equal logits at the k-th best outnumber what the kernels sort in one block
// (2048 candidates; all equal, or 3000 tied at the top spread over the vocabulary): the
// exact slow path, sampling::top_k's ids and values.
TEST(CudaKernels, TopKOfWideTiesMatchesTheHostSampler) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t n = 151936;
  std::vector<std::vector<float>> inputs{std::vector<float>(static_cast<size_t>(n), 1.0f),
                                         std::vector<float>(static_cast<size_t>(n), -INFINITY)};
  auto spread = random_floats(rng, n, 2.0f);
  for (int i = 0; i < 3000; ++i) spread[static_cast<size_t>((i * 50627) % n)] = 9.0f;
  inputs.push_back(spread);
  for (size_t c = 0; c < inputs.size(); ++c) {
    for (int k : {1, 40, 256}) {
      std::vector<TokenLogit> want;
      for (int64_t i = 0; i < n; ++i) want.push_back({static_cast<int32_t>(i), inputs[c][static_cast<size_t>(i)]});
      sampling::top_k(want, k);
      Dev<float> dl(inputs[c]);
      Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, k)));
      Dev<int32_t> ids(std::vector<int32_t>(static_cast<size_t>(k), -1));
      Dev<float> vals(static_cast<size_t>(k));
      cuda::launch_topk(dl.p, n, k, scratch.p, ids.p, vals.p, nullptr);
      const auto gi = ids.get();
      const auto gv = vals.get();
      for (int r = 0; r < k; ++r) {
        ASSERT_EQ(gi[static_cast<size_t>(r)], want[static_cast<size_t>(r)].id) << "input " << c << " k " << k << " rank " << r;
        ASSERT_EQ(gv[static_cast<size_t>(r)], want[static_cast<size_t>(r)].logit) << "input " << c << " k " << k;
      }
    }
  }
}

// A draw's chain after top-k, and the parameters a draw kernel reads in place (mapped pinned
// memory, as the backend's draw_host_), set for one draw.
struct DrawChain {
  float top_p, min_p, temp;
};
struct MappedDraw {
  cuda::DrawDev* d = nullptr;
  MappedDraw() { EXPECT_EQ(cudaHostAlloc(&d, sizeof(cuda::DrawDev), cudaHostAllocMapped), cudaSuccess); }
  ~MappedDraw() { cudaFreeHost(d); }
  MappedDraw(const MappedDraw&) = delete;
  MappedDraw& operator=(const MappedDraw&) = delete;
  const cuda::DrawDev* set(DrawChain c, double u) {
    *d = {.u = u, .top_p = c.top_p, .min_p = c.min_p, .log_min_p = c.min_p > 0 ? std::log(c.min_p) : 0.0f,
          .temp = c.temp};
    return d;
  }
};

// The draw on the device = sampling::finish on the same top k: random lists in top-k order
// (a tie at the top, -inf at the tail), top-p and min-p off and on (min-p above 1 keeps the
// first alone), temperatures below and above 1, uniforms 0, just below 1 and random; the
// position it feeds one further.
TEST(CudaKernels, DrawMatchesTheHostFinish) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(71);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  MappedDraw draw;
  int moved = 0;  // draws whose token is not the first candidate: the walk itself was tested
  for (int k : {1, 2, 40, 256}) {
    for (const DrawChain c : {DrawChain{1.0f, 0.0f, 1.0f}, DrawChain{0.95f, 0.05f, 0.8f}, DrawChain{0.5f, 0.0f, 1.5f},
                              DrawChain{1.0f, 0.2f, 0.3f}, DrawChain{0.9f, 1.5f, 1.0f}}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<TokenLogit> top;
        const auto v = random_floats(rng, k, 3.0f);
        for (int i = 0; i < k; ++i) top.push_back({static_cast<int32_t>((i * 7717 + trial) % 50000), v[static_cast<size_t>(i)]});
        if (k > 2 && trial % 2) top[1].logit = top[0].logit;  // equal values: ids decide the order
        if (k > 2) top[static_cast<size_t>(k - 1)].logit = -INFINITY;
        sampling::sort_desc(top);
        const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : uni(rng);
        std::vector<TokenLogit> host = top;
        const int32_t want = sampling::finish(host, c.top_p, c.min_p, c.temp, u);
        moved += want != top[0].id;
        std::vector<int32_t> ids;
        std::vector<float> vals;
        for (const TokenLogit& t : top) {
          ids.push_back(t.id);
          vals.push_back(t.logit);
        }
        Dev<int32_t> did(ids), pos(std::vector<int32_t>{9});
        Dev<float> dv(vals);
        cuda::launch_draw(did.p, dv.p, k, draw.set(c, u), did.p, nullptr, pos.p);  // the token where the list was
        EXPECT_EQ(did.get()[0], want) << "k " << k << " top_p " << c.top_p << " min_p " << c.min_p << " temp "
                                      << c.temp << " u " << u;
        EXPECT_EQ(pos.get()[0], 10);
      }
    }
  }
  EXPECT_GT(moved, 50);  // 71 with this seed
}

// Top-k off: the draw over every logit on the device = sampling::finish over the whole
// vocabulary (id order), or -1 exactly where the device's 256 best cannot decide it (the host's
// survivors are at least 256), and then the exact draw (the vocabulary sorted) = finish. Vocabularies with a short last chunk; peaked logits (a few far
// above the rest: top-p's cut and min-p's survivors among the 256), flat ones (neither);
// top-p alone, min-p alone (its survivors re-ordered by id), both, neither (the draw over
// every logit by chunk sums), min-p above 1; uniforms 0, just below 1 and random (the same
// token), and at the chunked mass through a random survivor and just below it (that survivor or
// the next: exp's last bit may differ).
TEST(CudaKernels, WholeVocabularyDrawMatchesTheHostFinish) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(73);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  MappedDraw draw;
  int decided = 0, undecided = 0, moved = 0, far = 0;
  for (int64_t n : {1000, 32000, 151936}) {
    Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::topk_scratch_bytes(n, cuda::kPickMaxTopK)));
    Dev<double> sums(static_cast<size_t>(cuda::draw_sums_bytes(n) / sizeof(double)));
    Dev<uint8_t> exact(std::vector<uint8_t>(cuda::exact_draw_scratch_bytes(n)));
    for (const bool peaked : {true, false}) {
      auto x = random_floats(rng, n, peaked ? 2.0f : 0.3f);
      if (peaked)
        for (int i = 0; i < 12; ++i) x[static_cast<size_t>((i * 7919 + 5) % n)] = 14.0f - 0.5f * i;
      Dev<float> dx(x);
      Dev<int32_t> ids(std::vector<int32_t>(cuda::kPickMaxTopK));
      Dev<float> vals(static_cast<size_t>(cuda::kPickMaxTopK));
      cuda::launch_topk(dx.p, n, cuda::kPickMaxTopK, scratch.p, ids.p, vals.p, nullptr);
      for (const DrawChain c : {DrawChain{0.9f, 0.0f, 1.0f}, DrawChain{1.0f, 0.05f, 0.7f},
                                DrawChain{0.95f, 0.05f, 1.3f}, DrawChain{1.0f, 0.0f, 1.0f},
                                DrawChain{1.0f, 0.0f, 0.6f}, DrawChain{0.8f, 1.5f, 1.0f}}) {
        // What the host's chain keeps before the draw (in its order: id order, or top-p's sorted
        // prefix), and the draw's mass through a random survivor, by chunks, for the boundary
        // uniforms: there any other order of the sums would move the token.
        std::vector<TokenLogit> host;
        for (int64_t i = 0; i < n; ++i) host.push_back({static_cast<int32_t>(i), x[static_cast<size_t>(i)]});
        std::vector<TokenLogit> survivors = host;
        sampling::top_p(survivors, c.top_p);
        sampling::min_p(survivors, c.min_p);
        const size_t m = survivors.size();
        float vmax = survivors[0].logit;
        for (const TokenLogit& t : survivors) vmax = std::max(vmax, t.logit);
        const auto term = [&](size_t i) {
          return std::exp(double(survivors[i].logit / c.temp) - double(vmax / c.temp));
        };
        const size_t at_survivor = static_cast<size_t>(uni(rng) * double(m - 1));
        double total = 0, mass = 0;
        for (size_t b0 = 0; b0 < m; b0 += 256) {
          double sum = 0;
          for (size_t i = b0; i < std::min(m, b0 + 256); ++i) {
            sum += term(i);
            if (i == at_survivor) mass = total + sum;
          }
          total += sum;
        }
        double u_edge = mass / total;
        while (u_edge * total < mass) u_edge = std::nextafter(u_edge, 1.0);
        while (std::nextafter(u_edge, 0.0) * total >= mass) u_edge = std::nextafter(u_edge, 0.0);
        const bool plain = c.top_p >= 1.0f && c.min_p <= 0.0f;
        for (int trial = 0; trial < 6; ++trial) {
          const double u = trial == 0 ? 0.0 : trial == 1 ? std::nextafter(1.0, 0.0) : trial == 4 ? u_edge
                           : trial == 5 ? std::nextafter(u_edge, 0.0) : uni(rng);
          std::vector<TokenLogit> chain = host;
          const int32_t want = sampling::finish(chain, c.top_p, c.min_p, c.temp, u);
          // At the boundary the host draws the survivor after it, just below the survivor
          // itself; the device's exp may differ from the host's in its last bit, which moves a
          // draw that close to either side (pick.cuh), so there it may give either.
          const bool edge = trial >= 4 && m > 1;
          if (edge) {
            EXPECT_EQ(want, survivors[at_survivor + (trial == 4 ? 1 : 0)].id);
          }
          const auto matches = [&](int32_t token) {
            return token == want ||
                   (edge && (token == survivors[at_survivor].id || token == survivors[at_survivor + 1].id));
          };
          Dev<int32_t> out(std::vector<int32_t>{-7}), pos(std::vector<int32_t>{3});
          cuda::launch_draw_whole(dx.p, n, ids.p, vals.p, draw.set(c, u), sums.p, out.p, nullptr, pos.p);
          const int32_t got = out.get()[0];
          const std::string what = "n " + std::to_string(n) + (peaked ? " peaked" : " flat") + " top_p " +
                                   std::to_string(c.top_p) + " min_p " + std::to_string(c.min_p) + " temp " +
                                   std::to_string(c.temp) + " u " + std::to_string(u);
          EXPECT_EQ(pos.get()[0], 4) << what;
          if (got == -1) {
            ++undecided;
            EXPECT_GE(m, 256u) << what << ": undecided with few survivors";
            EXPECT_FALSE(plain) << what;
            cuda::launch_exact_draw(dx.p, n, *draw.d, exact.p, out.p, nullptr);
            EXPECT_TRUE(matches(out.get()[0])) << what << ": " << out.get()[0] << " for " << want << " (exact, " << m
                                                << " survivors)";
            moved += out.get()[0] != survivors[0].id;
            far += at_survivor >= 256 && trial >= 4;
            continue;
          }
          ++decided;
          EXPECT_TRUE(matches(got)) << what << ": " << got << " for " << want << " (" << m << " survivors)";
          moved += got != survivors[0].id;
          far += at_survivor >= 256 && trial >= 4;
        }
      }
    }
  }
  EXPECT_GT(decided, 60);
  EXPECT_GT(undecided, 5);  // flat logits with top-p or min-p: the exact draw
  EXPECT_GT(moved, 30);
  EXPECT_GT(far, 10);  // boundaries past the first chunk
}

// Device argmax = greedy_token: random logits over vocabulary sizes around the grid's stride,
// a tie for the largest value (the lower id wins), all -inf (id 0); with a position to
// advance, the same id and the position one further.
TEST(CudaKernels, ArgmaxMatchesGreedyToken) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  Dev<uint8_t> scratch(std::vector<uint8_t>(cuda::argmax_scratch_bytes()));
  for (int64_t n : {1, 7, 255, 256, 32768, 32769, 151936}) {
    auto x = random_floats(rng, n);
    std::vector<std::vector<float>> inputs{x};
    if (n > 200) {
      x[n / 3] = 50.0f;
      x[n - 2] = 50.0f;  // the same largest value twice: id n/3 must win
      inputs.push_back(x);
    }
    inputs.push_back(std::vector<float>(static_cast<size_t>(n), -INFINITY));
    for (const auto& in : inputs) {
      Dev<float> dx(in);
      Dev<int32_t> out(std::vector<int32_t>{-1}), pos(std::vector<int32_t>{41});
      cuda::launch_argmax(dx.p, n, scratch.p, out.p, nullptr);
      EXPECT_EQ(out.get()[0], greedy_token(in.data(), n)) << "n " << n;
      cuda::launch_argmax(dx.p, n, scratch.p, out.p, nullptr, pos.p);  // with the position it feeds
      EXPECT_EQ(out.get()[0], greedy_token(in.data(), n)) << "n " << n;
      EXPECT_EQ(pos.get()[0], 42) << "n " << n;
    }
  }
}

// The K/V append lands row t of the batch at mirror row pos + t, K and V of different
// widths, touches no other row, and stages the rows for the host.
TEST(CudaKernels, KvAppendWritesRowsAtDevicePosition) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t kw = 96, vw = 64, cap = 40, n_tok = 3, pos = 29;
  const auto k = random_floats(rng, n_tok * kw), v = random_floats(rng, n_tok * vw);
  const auto mk0 = random_floats(rng, cap * kw), mv0 = random_floats(rng, cap * vw);
  Dev<float> dk(k), dv(v), dmk(mk0), dmv(mv0);
  Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(pos)});
  Dev<float> dsk(static_cast<size_t>(n_tok * kw)), dsv(static_cast<size_t>(n_tok * vw));
  cuda::launch_kv_append(dk.p, dv.p, kw, vw, n_tok, dpos.p, dmk.p, dmv.p, dsk.p, dsv.p, nullptr);
  EXPECT_EQ(dsk.get(), k);  // the staged copy for the host, row for row
  EXPECT_EQ(dsv.get(), v);
  const auto mk = dmk.get(), mv = dmv.get();
  std::vector<float> ek = mk0, ev = mv0;
  std::copy(k.begin(), k.end(), ek.begin() + pos * kw);
  std::copy(v.begin(), v.end(), ev.begin() + pos * vw);
  EXPECT_EQ(mk, ek);
  EXPECT_EQ(mv, ev);
}

// RoPE with the K/V append fused in (RopeLaunch::mirror_k) writes what RoPE and then
// launch_kv_append write, bit for bit: rotated Q and K, the K rows (rotated dims from the
// pair threads, the unrotated tail of a partial rotary from the append threads) and the V
// rows at mirror row pos + t and in the staging rows, no other mirror row touched.
TEST(CudaKernels, RopeWithKvAppendEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(23);
  struct C {
    bool neox;
    int64_t head_dim, n_rot, v_dim;
  };
  for (const C& c : {C{false, 64, 64, 64}, C{true, 128, 128, 128}, C{true, 80, 40, 64}, C{false, 64, 32, 48}}) {
    const int64_t n_head = 4, n_head_kv = 2, n_tok = 3, pos = 21, cap = 32;
    const int64_t q_w = n_head * c.head_dim, k_w = n_head_kv * c.head_dim, v_w = n_head_kv * c.v_dim;
    const auto q = random_floats(rng, n_tok * q_w), k = random_floats(rng, n_tok * k_w), v = random_floats(rng, n_tok * v_w);
    const auto mk0 = random_floats(rng, cap * k_w), mv0 = random_floats(rng, cap * v_w);
    Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(pos)});
    const auto run = [&](bool fused) {
      Dev<float> dq(q), dk(k), dv(v), dmk(mk0), dmv(mv0);
      Dev<float> dsk(static_cast<size_t>(n_tok * k_w)), dsv(static_cast<size_t>(n_tok * v_w));
      cuda::RopeLaunch r = rope_launch(dq.p, dk.p, n_tok, n_head, n_head_kv, c.head_dim, c.n_rot, dpos.p);
      r.neox = c.neox;
      r.freq_base = 10000.0f;
      if (fused) rope_append(r, dv.p, v_w, dmk.p, dmv.p, dsk.p, dsv.p);
      cuda::launch_rope(r);
      if (!fused) cuda::launch_kv_append(dk.p, dv.p, k_w, v_w, n_tok, dpos.p, dmk.p, dmv.p, dsk.p, dsv.p, nullptr);
      return std::vector<std::vector<float>>{dq.get(), dk.get(), dmk.get(), dmv.get(), dsk.get(), dsv.get()};
    };
    const auto sep = run(false), fus = run(true);
    const char* names[] = {"q", "k", "mirror k", "mirror v", "staged k", "staged v"};
    for (size_t i = 0; i < sep.size(); ++i)
      EXPECT_EQ(fus[i], sep[i]) << names[i] << ": neox " << c.neox << " head_dim " << c.head_dim << " n_rot " << c.n_rot;
  }
}

}  // namespace
}  // namespace frink::test

#else
TEST(CudaKernels, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
