// The attention layer's kernels beside attention itself (attention_test.cpp): the merge's
// rounded and Q8_0 outputs, RoPE, and the K/V append, against the host or the separate launches.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cpu/ops.h"
#include "cuda/attention.cuh"
#include "cuda/matmul.cuh"
#include "cuda/rope.cuh"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

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
