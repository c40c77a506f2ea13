// Norms and GLUs on the device, alone and fused with what follows them (the next product's
// input preparation, a router, a residual add, a norm folded into the product), against the host or
// the separate launches they replace.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cpu/ops.h"
#include "cuda/elementwise.cuh"
#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "cuda/norm.cuh"
#include "cuda/occupancy.h"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

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

}  // namespace
}  // namespace frink::test

#endif  // FRINK_HAVE_CUDA
