// QK-norm inside the rotation's launch (RopeLaunch::qk_norm) against the two launches it
// replaces: the per-head norm pair, then RoPE with the K/V append. Bit for bit, since both run
// norm.cu's row body with the same thread count and rope.cu's pair arithmetic.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

TEST(CudaRopeNorm, QkNormInTheRotationEqualsNormsThenRope) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(29);
  struct C {
    bool neox;
    int64_t head_dim, n_rot, v_dim, n_tok;
  };
  // qwen3's shape (neox, 128, full rotary), head dim 256 (two pairs per thread), partial
  // rotary (unrotated K dims appended by the extra blocks), adjacent pairs, a batch of 5.
  for (const C& c : {C{true, 128, 128, 128, 1}, C{true, 256, 256, 256, 2}, C{true, 128, 64, 128, 3},
                     C{false, 64, 64, 48, 5}}) {
    const int64_t n_head = 8, n_head_kv = 2, pos = 37, cap = 64;
    const int64_t q_w = n_head * c.head_dim, k_w = n_head_kv * c.head_dim, v_w = n_head_kv * c.v_dim;
    const auto q = random_floats(rng, c.n_tok * q_w, 3.0f), k = random_floats(rng, c.n_tok * k_w, 3.0f);
    const auto v = random_floats(rng, c.n_tok * v_w);
    const auto qw = random_floats(rng, c.head_dim), kw = random_floats(rng, c.head_dim);
    const auto mk0 = random_floats(rng, cap * k_w), mv0 = random_floats(rng, cap * v_w);
    Dev<int32_t> dpos(std::vector<int32_t>{static_cast<int32_t>(pos)});
    Dev<float> dqw(qw), dkw(kw);
    // mode 0: RoPE alone; 1: the norm pair, then RoPE; 2: the fused launch.
    const auto run = [&](int mode) {
      Dev<float> dq(q), dk(k), dv(v), dmk(mk0), dmv(mv0);
      Dev<float> dsk(static_cast<size_t>(c.n_tok * k_w)), dsv(static_cast<size_t>(c.n_tok * v_w));
      const auto norm = [&](float* x, const float* w, int64_t heads) {
        cuda::NormParams n;
        n.x = x;
        n.y = x;
        n.x_stride = n.y_stride = n.n = c.head_dim;
        n.n_rows = c.n_tok * heads;
        n.w = w;
        n.eps = 1e-6f;
        return n;
      };
      cuda::RopeLaunch r = rope_launch(dq.p, dk.p, c.n_tok, n_head, n_head_kv, c.head_dim, c.n_rot, dpos.p);
      r.neox = c.neox;
      r.freq_base = 1000000.0f;
      rope_append(r, dv.p, v_w, dmk.p, dmv.p, dsk.p, dsv.p);
      r.norm_x = norm(dq.p, dqw.p, n_head);
      r.norm_x2 = norm(dk.p, dkw.p, n_head_kv);
      if (mode == 1) cuda::launch_norm_pair(r.norm_x, r.norm_x2);
      r.qk_norm = mode == 2;
      cuda::launch_rope(r);
      return std::vector<std::vector<float>>{dq.get(), dk.get(), dmk.get(), dmv.get(), dsk.get(), dsv.get()};
    };
    const auto sep = run(1), fus = run(2);
    const char* names[] = {"q", "k", "mirror k", "mirror v", "staged k", "staged v"};
    for (size_t i = 0; i < sep.size(); ++i)
      EXPECT_EQ(fus[i], sep[i]) << names[i] << ": neox " << c.neox << " head_dim " << c.head_dim << " n_rot " << c.n_rot
                                << " n_tok " << c.n_tok;
    // The norms ran: without them q and k differ (inputs of scale 3, norm weights random).
    const auto plain = run(0);
    EXPECT_NE(fus[0], plain[0]);
    EXPECT_NE(fus[1], plain[1]);
  }
}

}  // namespace
}  // namespace frink::test

#else
TEST(CudaRopeNorm, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
