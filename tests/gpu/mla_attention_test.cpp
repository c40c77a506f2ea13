// Latent attention on the device (src/cuda/mla_attention.cu) against a double-precision
// causal softmax over the shared rows, V being each row's first `rank` floats: the released
// models' widths (576 / 512) and narrower ones; decode-sized batches on the split path (keys
// cut into 64-key splits and merged; grids sized past the length, as a token graph launches
// them, and contexts long enough for wider splits) and prompt batches on the direct path;
// head counts that leave a block's last warps idle; the output's Q8_0 copy (the wv_b product's
// input) against the host's quantization of the f32 output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/mla_attention.cuh"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

struct MlaCase {
  int64_t n_tok, pos0, n_head, width, rank, max_keys;
};

TEST(CudaMla, AttentionMatchesDoubleSoftmax) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(7);
  const MlaCase cases[] = {
      {1, 0, 16, 576, 512, 1},        {1, 200, 16, 576, 512, 256},   {3, 700, 16, 576, 512, 1024},
      {1, 20000, 16, 576, 512, 32768}, {5, 61, 20, 576, 512, 66},     {19, 0, 16, 576, 512, 19},
      {40, 300, 3, 96, 64, 340},      {1, 129, 1, 576, 512, 256},    {9, 0, 128, 576, 512, 9},
  };
  for (const MlaCase& c : cases) {
    const int64_t W = c.width, R = c.rank, H = c.n_head;
    const auto q = random_floats(rng, c.n_tok * H * W), rows = random_floats(rng, c.max_keys * W);
    const float scale = 1.0f / std::sqrt(192.0f);
    std::vector<float> ref(static_cast<size_t>(c.n_tok * H * R));
    for (int64_t t = 0; t < c.n_tok; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + (t * H + h) * W;
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = 0; j <= c.pos0 + t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < W; ++i) d += double(qh[i]) * rows[static_cast<size_t>(j * W + i)];
          s.push_back(d * scale);
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < R; ++i) {
          double o = 0;
          for (size_t j = 0; j < s.size(); ++j) o += s[j] * rows[j * static_cast<size_t>(W) + static_cast<size_t>(i)];
          ref[static_cast<size_t>((t * H + h) * R + i)] = static_cast<float>(o / sum);
        }
      }
    Dev<float> dq(q), drows(rows), out(ref.size());
    Dev<int8_t> q8(ref.size());
    Dev<float> d8(ref.size() / 32);
    Dev<float> part(std::max<size_t>(1, cuda::mla_scratch_floats(c.n_tok, c.max_keys, H, R)));
    Dev<int32_t> pos(std::vector<int32_t>{static_cast<int32_t>(c.pos0)});
    cuda::MlaAttnParams p;
    p.q = dq.p;
    p.rows = drows.p;
    p.out = out.p;
    p.n_tok = c.n_tok;
    p.n_head = H;
    p.width = W;
    p.rank = R;
    p.pos = pos.p;
    p.max_keys = c.max_keys;
    p.scale = scale;
    p.partial = part.p;
    p.out_q8 = q8.p;
    p.out_d8 = d8.p;
    cuda::launch_mla_attention(p);
    const auto got = out.get();
    // The Q8_0 copy is the host's quantization of the f32 output, bit for bit.
    const auto gq = q8.get();
    const auto gd = d8.get();
    size_t bad = 0;
    for (size_t b = 0; b < got.size() / 32; ++b) {
      quant::BlockQ8_0 hb;
      quantize_row(GgmlType::Q8_0, got.data() + b * 32, &hb, 32);
      bad += f16_to_f32(hb.d) != gd[b] || !std::equal(hb.qs, hb.qs + 32, gq.begin() + static_cast<ptrdiff_t>(b * 32));
    }
    EXPECT_EQ(bad, 0u) << "Q8_0 blocks unlike the host's of the output";
    const double e = nmse(got.data(), ref.data(), ref.size());
    std::printf("[mla] n_tok %lld pos0 %lld heads %lld width %lld rank %lld max_keys %lld: nmse %.3g\n",
                static_cast<long long>(c.n_tok), static_cast<long long>(c.pos0), static_cast<long long>(H),
                static_cast<long long>(W), static_cast<long long>(R), static_cast<long long>(c.max_keys), e);
    EXPECT_LT(e, 1e-9) << "n_tok " << c.n_tok << " pos0 " << c.pos0 << " heads " << H;
  }
  EXPECT_FALSE(cuda::mla_attention_supported(1024, 512));  // past the registers a lane holds
  EXPECT_FALSE(cuda::mla_attention_supported(576, 640));
}

}  // namespace
}  // namespace frink::test
#endif
