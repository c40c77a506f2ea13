// Device attention (src/cuda/attention.cu) against a double-precision causal softmax (windows,
// ALiBi and sinks as the host's attend has them), for the paths launch_attention picks:
// 64-key split-K decode (grouped and per-head kernels, merge), the exact f32 tiled prefill
// and the tensor-core (f16 in, f32 accumulate) prefill. Each case prints its NMSE, so a run on
// the device shows the margin to each bound.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cpu/ops.h"
#include "cuda/attention.cuh"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

struct Case {
  int64_t n_tok, pos0, n_head, n_head_kv, hd;
  float softcap = 0.0f;
  int64_t max_keys = 0;  // 0: pos0 + n_tok (the tight grid); more: how a token graph launches it
  int64_t window = 0;    // > 0: sliding window
  bool alibi = false;    // slopes for max_bias 8 (cpu::alibi_slope)
  bool sinks = false;    // a random sink logit per head
  float q_mag = 1.0f;    // queries scaled by this (scale divided by it): beyond f16's range
  float kv_mag = 1.0f;   // keys and values scaled by this (scale divided by it)
};

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "n_tok %lld pos0 %lld heads %lld/%lld hd %lld softcap %g max_keys %lld window %lld alibi %d sinks %d "
                "q_mag %g kv_mag %g",
                static_cast<long long>(c.n_tok), static_cast<long long>(c.pos0), static_cast<long long>(c.n_head),
                static_cast<long long>(c.n_head_kv), static_cast<long long>(c.hd), c.softcap,
                static_cast<long long>(c.max_keys), static_cast<long long>(c.window), c.alibi, c.sinks, c.q_mag,
                c.kv_mag);
  return buf;
}

// Runs one case on the device and returns the NMSE against the double reference. scratch: the
// attention scratch to use as it is (an earlier case's leftovers in it), else a fresh one.
double run_case(std::mt19937& rng, const Case& c, Dev<float>* scratch = nullptr) {
  const int64_t max_keys = c.max_keys ? c.max_keys : c.pos0 + c.n_tok;
  const int64_t n_keys = c.pos0 + c.n_tok, kw = c.n_head_kv * c.hd;
  auto q = random_floats(rng, c.n_tok * c.n_head * c.hd), k = random_floats(rng, n_keys * kw),
       v = random_floats(rng, n_keys * kw);
  for (auto& x : q) x *= c.q_mag;
  for (auto& x : k) x *= c.kv_mag;
  for (auto& x : v) x *= c.kv_mag;
  const float scale = 1.0f / (std::sqrt(static_cast<float>(c.hd)) * c.q_mag * c.kv_mag);
  std::vector<float> slopes(static_cast<size_t>(c.n_head)), sinks = random_floats(rng, c.n_head, 2.0f);
  for (int64_t h = 0; h < c.n_head; ++h) slopes[static_cast<size_t>(h)] = cpu::alibi_slope(h, c.n_head, 8.0f);
  std::vector<float> ref(static_cast<size_t>(c.n_tok * c.n_head * c.hd));
  std::vector<double> s;
  for (int64_t t = 0; t < c.n_tok; ++t)
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t hk = h / (c.n_head / c.n_head_kv), pos = c.pos0 + t;
      const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      s.clear();
      double mx = c.sinks ? sinks[static_cast<size_t>(h)] : -1e300;
      const float* qh = q.data() + (t * c.n_head + h) * c.hd;
      for (int64_t j = first; j <= pos; ++j) {
        const float* kj = k.data() + j * kw + hk * c.hd;
        double d = 0;
        for (int64_t i = 0; i < c.hd; ++i) d += double(qh[i]) * kj[i];
        d *= scale;
        if (c.softcap > 0) d = c.softcap * std::tanh(d / c.softcap);
        if (c.alibi) d -= double(slopes[static_cast<size_t>(h)]) * double(pos - j);
        s.push_back(d);
        mx = std::max(mx, d);
      }
      double sum = c.sinks ? std::exp(sinks[static_cast<size_t>(h)] - mx) : 0.0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      std::vector<double> o(static_cast<size_t>(c.hd), 0.0);
      for (size_t j = 0; j < s.size(); ++j) {
        const float* vj = v.data() + (first + static_cast<int64_t>(j)) * kw + hk * c.hd;
        for (int64_t i = 0; i < c.hd; ++i) o[static_cast<size_t>(i)] += s[j] * vj[i];
      }
      for (int64_t i = 0; i < c.hd; ++i)
        ref[static_cast<size_t>((t * c.n_head + h) * c.hd + i)] = static_cast<float>(o[static_cast<size_t>(i)] / sum);
    }
  const size_t need = cuda::attn_scratch_floats(c.n_tok, max_keys, c.n_head, c.n_head_kv, c.hd, c.hd);
  if (scratch) {
    EXPECT_GE(scratch->n, need) << describe(c);
  }
  // part holds plausible leftovers (m = l = acc = 10), as the engine's scratch does from
  // earlier layers: a merge that read a split nobody wrote would take them in.
  Dev<float> dq(q), dk(k), dv(v), dout(std::vector<float>(ref.size(), -1e30f)),
      part(std::vector<float>(scratch ? 0 : need, 10.0f));
  float* const scratch_p = scratch ? scratch->p : part.p;
  Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(c.pos0)});
  Dev<float> dslopes(slopes), dsinks(sinks);
  cuda::AttnParams p =
      attn_params(dq.p, dk.p, dv.p, dout.p, scratch_p, c.n_tok, dpos.p, max_keys, c.n_head, c.n_head_kv, c.hd);
  p.scale = scale;
  p.softcap = c.softcap;
  p.window = c.window;
  p.alibi_slopes = c.alibi ? dslopes.p : nullptr;
  p.sinks = c.sinks ? dsinks.p : nullptr;
  cuda::launch_attention(p);
  const auto y = dout.get();
  return nmse(y.data(), ref.data(), ref.size());
}

// Decode and small batches (n_tok < kAttnPrefillMinTok, or head dims above 128): 64-key
// split-K in f32. Lengths on both sides of split boundaries (1, 63, 64, 65, 300, 5000 keys),
// groups of 1, 4, 8, 12 and 16 query heads per KV head (12: 6 heads per block; 16: two
// blocks per KV head), head dims 64/72/128/256 and 33 (not a multiple of 4: the per-head
// fallback kernel), windows narrower than a split, ALiBi, sinks, softcap, and grids sized for
// far more keys than there are (a replayed token graph), whose idle splits must not leak in.
TEST(CudaAttention, DecodeSplitKMatchesReference) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(29);
  const Case cases[] = {
      {1, 0, 8, 8, 128},                                  // 1 key, group 1
      {1, 62, 32, 8, 128},                                // 63 keys, group 4 (Llama-3 8B)
      {1, 63, 32, 4, 128},                                // 64 keys, group 8
      {1, 64, 8, 1, 64},                                  // 65 keys
      {2, 298, 16, 4, 64, 30.0f},                         // 300 keys, softcap
      {4, 62, 8, 2, 128},                                 // queries at 63..66: across a split edge
      {4, 4996, 32, 8, 128, 0.0f, 8192},                  // 5000 keys in a grid of 8192
      {3, 4997, 8, 2, 256},                               // head dim 256, 5000 keys
      {1, 4999, 16, 16, 64, 0.0f, 0, 1000, false, true},  // window + sinks (gpt-oss-like), group 1
      {1, 4999, 8, 1, 128, 0.0f, 0, 0, true},             // ALiBi, group 8
      {2, 298, 4, 4, 256, 0.0f, 1024, 70, true, true},    // everything at head dim 256
      {4, 400, 8, 2, 128, 0.0f, 0, 10},                   // window of 10 keys inside a split
      {1, 299, 12, 1, 128},                               // group 12: 6 heads per block
      {1, 299, 16, 1, 64, 0.0f, 4096},                    // group 16: 2 blocks per KV head
      {3, 61, 8, 2, 72},                                  // head dim 72
      {1, 100, 4, 2, 33},                                 // head dim 33: per-head kernel
      {2, 700, 6, 3, 40, 30.0f, 2048, 0, false, true},    // head dim 40, group 2
      {5, 127, 8, 2, 128, 0.0f, 512},                     // n_tok 5
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(cuda::attn_uses_split_k(c.n_tok, c.hd, c.hd)) << describe(c);
    const double e = run_case(rng, c);
    std::printf("decode  %s: nmse %.3g\n", describe(c).c_str(), e);
    // f32 online softmax with the host's operation order up to summation: ~1e-13; bound 1e-9.
    EXPECT_LT(e, 1e-9) << describe(c);
  }
}

// Grids for 65536 keys (a token graph past 32k) take even splits of 32-key tiles (attn_split):
// each query's tiles shared out over a fixed count of splits, so a split spans several tiles
// or (fewer tiles than splits: a short context, a narrow window) none, a window starts inside
// one, queries of one batch split differently, and the merge runs on its wide blocks, skipping
// the empty splits. The same answers as above.
TEST(CudaAttention, LongContextEvenSplitsMatchReference) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  const Case cases[] = {
      {1, 4999, 32, 8, 128, 0.0f, 65536},                     // 5000 keys, group 4 (Llama-3 8B)
      {4, 300, 8, 2, 128, 30.0f, 65536},                      // queries at 301..304, softcap
      {1, 4999, 16, 16, 64, 0.0f, 65536, 1000, false, true},  // window + sinks, group 1
      {1, 200, 16, 16, 64, 0.0f, 65536, 100, true},           // window from a split's second tile, ALiBi
      {1, 3000, 8, 4, 256, 0.0f, 65536},                      // head dim 256: 2 key sets, 2 heads a block
      {1, 2500, 48, 8, 72, 0.0f, 65536},                      // head dim 72 (7 key sets of 18 columns), 6 heads
      {1, 20000, 32, 8, 128, 0.0f, 65536},                    // more tiles than splits (H200: 6 or 7 a split)
      {4, 12000, 8, 2, 128, 0.0f, 65536, 3000},               // 4 queries, each its own share of the tiles
  };
  for (const Case& c : cases) {
    cuda::AttnParams q;  // the shape alone decides (device memory is not read)
    q.n_tok = c.n_tok;
    q.max_keys = c.max_keys;
    q.n_head = c.n_head;
    q.n_head_kv = c.n_head_kv;
    q.head_dim_k = q.head_dim_v = c.hd;
    const cuda::AttnSplit sp = cuda::attn_split(q);
    ASSERT_EQ(sp.tile_keys, 32) << describe(c);
    ASSERT_EQ(sp.split_keys, 0) << describe(c);
    ASSERT_GT(sp.even_splits, 0) << describe(c);
    // Every split's partial fits the scratch the engine sizes for this grid.
    ASSERT_LE(static_cast<size_t>(sp.even_splits * c.n_tok * c.n_head * (2 + c.hd)),
              cuda::attn_scratch_floats(c.n_tok, c.max_keys, c.n_head, c.n_head_kv, c.hd, c.hd))
        << describe(c);
    const double e = run_case(rng, c);
    std::printf("decode  %s: nmse %.3g (even splits)\n", describe(c).c_str(), e);
    EXPECT_LT(e, 1e-9) << describe(c);
  }
}

// The decode tile rules (attn_split): grids for at most 32 splits of 16 or 32 keys (a token
// graph's bound of 512 or 1024 keys) take one tile of that many keys, whose lanes split the
// head dim and meet by shuffles; longer grids below the two-tile rule take 64-key splits as
// two 32-key tiles. Head dims whose float4 columns do not divide among the lanes (72: 18
// columns over 8 lanes; 40), 1 to 8 heads per block, windows (one starting in a split's
// second tile), sinks, ALiBi, softcap, queries across tile edges, and grids much longer than
// the context.
TEST(CudaAttention, DecodeTileRulesMatchReference) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(37);
  const struct {
    Case c;
    int64_t tile, split;  // keys
  } cases[] = {
      {{1, 62, 32, 8, 128, 0.0f, 512}, 16, 16},                     // 63 keys, Llama-3 8B's token graph at depth 0
      {{1, 15, 32, 8, 128, 0.0f, 512}, 16, 16},                     // exactly one tile
      {{4, 298, 8, 2, 128, 30.0f, 512}, 16, 16},                    // 4 queries across tile edges, softcap
      {{1, 499, 16, 16, 64, 0.0f, 512, 10, false, true}, 16, 16},   // window of 10 + sinks, group 1
      {{3, 61, 8, 2, 72}, 16, 16},                                  // head dim 72, tight grid
      {{1, 20, 12, 1, 40}, 16, 16},                                 // group 12: 6 heads per block, head dim 40
      {{1, 700, 32, 8, 128, 0.0f, 1024}, 32, 32},                   // 701 keys in a 1024-key grid
      {{1, 900, 8, 1, 256, 0.0f, 1024, 0, true}, 32, 32},           // ALiBi, 8 heads per block, head dim 256
      {{2, 600, 4, 4, 256, 0.0f, 1024, 70, true, true}, 32, 32},    // everything at head dim 256
      {{1, 4099, 32, 8, 128, 0.0f, 8192}, 32, 64},                  // Llama-3 8B at depth 4096
      {{4, 2000, 8, 2, 128, 30.0f, 4096}, 32, 64},                  // queries across a split's tiles, softcap
      {{1, 3000, 16, 16, 64, 0.0f, 4096, 50, true, true}, 32, 64},  // window from a second tile, ALiBi, sinks
      {{1, 2500, 12, 1, 72, 0.0f, 8192}, 32, 64},                   // 6 heads per block, head dim 72
  };
  for (const auto& [c, tile, split] : cases) {
    cuda::AttnParams q;  // the shape alone decides (device memory is not read)
    q.n_tok = c.n_tok;
    q.max_keys = c.max_keys ? c.max_keys : c.pos0 + c.n_tok;
    q.n_head = c.n_head;
    q.n_head_kv = c.n_head_kv;
    q.head_dim_k = q.head_dim_v = c.hd;
    const cuda::AttnSplit sp = cuda::attn_split(q);
    ASSERT_EQ(sp.tile_keys, tile) << describe(c);
    ASSERT_EQ(sp.split_keys, split) << describe(c);
    const double e = run_case(rng, c);
    std::printf("decode  %s: nmse %.3g (%lld-key tiles, %lld-key splits)\n", describe(c).c_str(), e,
                static_cast<long long>(tile), static_cast<long long>(split));
    EXPECT_LT(e, 1e-9) << describe(c);
  }
}

// Prefill batches: the tensor-core kernel from kAttnMmaMinTok queries at head dims 64/128/256
// (with pos0 > 0, partial query and key tiles, GQA, windows narrower than a tile, ALiBi,
// sinks, softcap, and inputs beyond f16's range; head dim 256 steps over half tiles), the f32
// tiled kernel for the rest, and split-K with several 64-key tiles per split for smaller
// batches at head dims above 128.
TEST(CudaAttention, PrefillMatchesReference) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(31);
  const Case cases[] = {
      {128, 0, 8, 2, 128},
      {200, 37, 4, 4, 64},
      {600, 1000, 8, 2, 128},
      {256, 300, 32, 8, 128},                               // Llama-3 8B's heads
      {300, 500, 8, 1, 128, 0.0f, 0, 100, false, true},     // window + sinks, group 8
      {150, 20, 6, 6, 64, 30.0f, 0, 0, true},               // softcap + ALiBi
      {129, 4000, 4, 2, 128, 0.0f, 0, 40, true, true},      // window narrower than a tile
      {131, 70, 4, 2, 64, 0.0f, 0, 0, false, false, 1e5f},  // |q| beyond f16: Q staged x 2^-15
      {192, 100, 4, 2, 128, 0.0f, 0, 0, false, false, 1.0f, 1e5f},  // |k|, |v| beyond f16
      {8, 0, 4, 2, 128},                                    // below kAttnMmaMinTok: f32 tiled
      {100, 300, 8, 2, 128},                                // f32 tiled
      {140, 5, 4, 2, 72},                                   // head dim 72: f32 tiled
      {160, 10, 4, 4, 256},                                 // head dim 256: tensor cores, Q from shared memory
      {300, 1000, 16, 8, 256, 0.0f, 0, 1024},               // gemma3-12b's heads, a window over half-tile steps
      {200, 77, 8, 4, 256, 50.0f, 0, 0, false, true},       // gemma2's softcap, sinks, partial steps
      {130, 40, 4, 2, 256, 0.0f, 0, 0, true, false, 1e5f, 1e5f},  // ALiBi; |q|, |k|, |v| beyond f16
      {40, 1200, 8, 2, 256, 0.0f, 0, 700, false, true},     // head dim 256 below kAttnMmaMinTok: split-K
      {20, 1500, 4, 1, 128, 30.0f, 4096, 0, true},          // head dim 128 below kAttnMmaMinTok: f32 tiled
  };
  for (const Case& c : cases) {
    const bool mma = !cuda::attn_uses_split_k(c.n_tok, c.hd, c.hd) && cuda::attn_uses_tensor_cores(c.n_tok, c.hd, c.hd);
    const double e = run_case(rng, c);
    std::printf("prefill %s (%s): nmse %.3g\n", describe(c).c_str(), mma ? "tensor cores" : "f32", e);
    // Tensor cores: Q, K, V and P rounded to f16 (relative error <= 2^-11, rms ~2.8e-4 each)
    // with f32 accumulation. A unit-variance logit q.k * scale over hd products then errs by
    // ~sqrt(2) * 2.8e-4 * |logit| (~4e-4), a relative error of each softmax weight of that
    // size; P's and V's roundings add 2.8e-4 each: NMSE ~ (4e-4)^2 + 2 (2.8e-4)^2 ~ 3e-7.
    // Bound 1e-5: 30x that, and 10x inside the model parity tests' 1e-4 against the host.
    // f32 paths: ~1e-13, bound 1e-9 as for decode.
    EXPECT_LT(e, mma ? 1e-5 : 1e-9) << describe(c) << (mma ? " (tensor cores)" : " (f32)");
  }
}

// The tensor-core prefill's f16 copy of K/V (and its per-tile scale flags) in a scratch that
// earlier batches used: a batch whose K/V were stored scaled down (|k|, |v| beyond f16), then
// plain ones over the same and fewer tiles, then scaled again. A flag left from an earlier
// batch would scale a tile by 2^15.
TEST(CudaAttention, PrefillScratchReusedAcrossBatches) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(41);
  const Case cases[] = {
      {192, 300, 8, 2, 128, 0.0f, 0, 0, false, false, 1.0f, 1e5f},
      {192, 300, 8, 2, 128},
      {130, 40, 8, 2, 128},
      {160, 200, 8, 2, 128, 0.0f, 0, 0, false, false, 1.0f, 1e5f},
      {200, 250, 8, 2, 128},
      {140, 90, 8, 2, 256, 0.0f, 0, 0, false, false, 1.0f, 1e5f},  // half-tile steps read the same flags
      {150, 60, 8, 2, 256},
  };
  size_t most = 0;
  for (const Case& c : cases)
    most = std::max(most, cuda::attn_scratch_floats(c.n_tok, c.pos0 + c.n_tok, c.n_head, c.n_head_kv, c.hd, c.hd));
  Dev<float> scratch(std::vector<float>(most, 10.0f));
  for (const Case& c : cases) {
    ASSERT_TRUE(cuda::attn_uses_tensor_cores(c.n_tok, c.hd, c.hd)) << describe(c);
    const double e = run_case(rng, c, &scratch);
    std::printf("prefill %s (scratch reused): nmse %.3g\n", describe(c).c_str(), e);
    EXPECT_LT(e, 1e-5) << describe(c);
  }
}

// The first kernels' table (it stood in kernels_test.cpp): decode and small batches, GQA, head
// widths that are not multiples of 32, contexts spanning several splits, softcap, grids sized
// for far more keys than there are, windows, ALiBi and sinks alone and together. All below
// kAttnMmaMinTok queries: f32 paths throughout.
TEST(CudaAttention, SmallBatchesMatchReference) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(13);
  const Case cases[] = {
      {1, 0, 4, 2, 64, 0}, {1, 700, 8, 2, 128, 0}, {5, 3, 4, 4, 40, 0}, {3, 530, 6, 3, 72, 30.0f},
      {1, 2047, 2, 1, 256, 0}, {17, 0, 4, 1, 64, 50.0f}, {1, 700, 8, 2, 128, 0, 4096},
      {1, 0, 4, 2, 64, 0, 512}, {2, 300, 4, 2, 64, 0, 1024},
      // n_tok >= kAttnPrefillMinTok: the tiled prefill kernel (partial query and
      // key tiles, odd and non-multiple-of-32 head dims); hd 256 falls back
      {40, 300, 8, 2, 128, 0}, {9, 0, 2, 2, 40, 0}, {33, 5, 4, 4, 72, 30.0f},
      {64, 0, 4, 2, 128, 0}, {8, 31, 3, 1, 33, 0}, {12, 10, 2, 1, 256, 0},
      // decode and small batches with groups of 4..8 query heads: the grouped
      // split-K kernel (group 16 falls back to the per-head one)
      {1, 1000, 16, 2, 64, 30.0f}, {3, 600, 8, 1, 72, 0}, {2, 513, 12, 3, 40, 0},
      {1, 40, 16, 1, 64, 0}, {1, 300, 8, 2, 128, 0, 2048},
      // windows (starting inside a split and inside a tile, narrower than a tile),
      // ALiBi and sinks, alone and together (gpt-oss: window + sinks), on all paths
      {1, 700, 8, 2, 128, 0, 0, 100}, {1, 700, 8, 2, 128, 0, 4096, 100},
      {1, 700, 6, 6, 64, 0, 0, 300}, {40, 300, 8, 2, 64, 0, 0, 50},
      {33, 0, 4, 4, 72, 0, 0, 16}, {5, 100, 4, 4, 64, 0, 0, 0, true},
      {20, 10, 6, 6, 40, 0, 0, 0, true}, {1, 500, 8, 2, 64, 0, 0, 0, true},
      {1, 300, 8, 2, 64, 0, 0, 0, false, true}, {17, 5, 4, 1, 64, 0, 0, 0, false, true},
      {1, 600, 8, 2, 64, 0, 0, 128, false, true}, {12, 200, 16, 2, 64, 0, 0, 64, false, true},
      {3, 40, 5, 5, 64, 30.0f, 0, 0, false, true}
  };
  for (const Case& c : cases) {
    ASSERT_FALSE(cuda::attn_uses_tensor_cores(c.n_tok, c.hd, c.hd)) << describe(c);
    const double e = run_case(rng, c);
    std::printf("small   %s: nmse %.3g\n", describe(c).c_str(), e);
    // f32 online softmax and sums over <= 2048 keys: ~1e-12; bound 1e-9.
    EXPECT_LT(e, 1e-9) << describe(c);
  }
}

}  // namespace
}  // namespace frink::test

#endif  // FRINK_HAVE_CUDA
