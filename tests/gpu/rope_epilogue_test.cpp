// RoPE and the K/V append in the q/k/v products' store (MatmulParams::rope) against the
// launches they replace: the products, then launch_rope with the append. Bit for bit: both
// store the same product values (store_row's epilogue) and rotate them with rope_math.cuh.
// The predicate (matmul_can_rope) is checked without a device: it reads no device memory.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include "cuda/matmul.cuh"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "quant/ggml_type.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

// The layer's shape: n_head query heads, n_head_kv K/V heads of head_dim, n_in inputs.
struct Shape {
  int64_t n_in, n_head, n_head_kv, head_dim, n_rot;
};

// p for W (type t) times x [n_tok][n_in] into y [n_tok][n_out].
cuda::MatmulParams product(GgmlType t, const void* w, const Shape& s, int64_t n_out, const float* x, int64_t n_tok,
                           float* y, float* act) {
  cuda::MatmulParams p = mat_params(t, w, s.n_in, n_out, x, n_tok, y);
  p.act_round = act;
  return p;
}

// r over q/k/v buffers of s's shape, appending to the mirror and staging buffers.
cuda::RopeLaunch rope_of(const Shape& s, int64_t n_tok, const int32_t* pos, float* q, float* k, float* v, float* mk,
                         float* mv, float* sk, float* sv) {
  cuda::RopeLaunch r = rope_launch(q, k, n_tok, s.n_head, s.n_head_kv, s.head_dim, s.n_rot, pos);
  r.freq_base = 500000.0f;
  rope_append(r, v, s.n_head_kv * s.head_dim, mk, mv, sk, sv);
  return r;
}

// The first index where a and b differ (as floats), or -1 when equal: a short message for
// buffers of up to 200k floats.
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

TEST(CudaRopeEpilogue, RotationInTheStoreEqualsProductsThenRope) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(71);
  struct C {
    Shape s;
    bool freq_factors, yarn, bias;
    int32_t pos;
  };
  // Llama's head (128, full rotary) with llama3's frequency factors, q/k bias and a scale;
  // partial rotary (pairs past n_rot stored unrotated, appended by the store); YaRN with
  // partial rotary at a position in the thousands (the angle's repeated products); gpt-oss's
  // width, 2880 (a partial last 8-block group), with YaRN and full rotary.
  const std::vector<C> cases = {{{4096, 8, 2, 128, 128}, true, false, true, 37},
                                {{4096, 4, 2, 64, 32}, false, false, false, 5},
                                {{4096, 4, 1, 64, 48}, false, true, true, 3001},
                                {{2880, 4, 1, 64, 64}, false, true, true, 40}};
  // Q4_0, Q8_0 and Q4_K as the file holds them, then those, Q5_K and Q6_K as the device keeps them (x8_type).
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::BF16, GgmlType::Q4_0,
                            GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  for (int ti = 0; ti < 9; ++ti)
    for (const C& c : cases) {
      const GgmlType t = types[ti];
      const bool x8 = ti >= 4;
      const Shape& s = c.s;
      // K-quants at gpt-oss's 2880; rows as the file holds them there (1620 and 3060 bytes) are
      // not 16-byte aligned, so the staged kernels never take them (the device pads them).
      if (s.n_in % ggml_type_info(t).block_elems != 0 || (!x8 && ggml_row_bytes(t, s.n_in) % 16 != 0)) continue;
      const int64_t q_w = s.n_head * s.head_dim, kv_w = s.n_head_kv * s.head_dim, cap = c.pos + 8;
      auto bq = random_weight_row(rng, t, s.n_in * q_w), bk = random_weight_row(rng, t, s.n_in * kv_w),
           bv = random_weight_row(rng, t, s.n_in * kv_w);
      if (x8)  // rows as the device keeps them (gpt-oss's 2880: a partial last group)
        for (auto* b : {&bq, &bk, &bv}) *b = device_rows(*b, t, s.n_in);
      Dev<uint8_t> wq(bq), wk(bk), wv(bv);
      const int type = x8 ? to_x8(t, wq.p, bq.size(), s.n_in) : static_cast<int>(t);
      if (x8) {
        to_x8(t, wk.p, bk.size(), s.n_in);
        to_x8(t, wv.p, bv.size(), s.n_in);
      }
      auto fb = random_floats(rng, s.n_rot / 2);
      for (float& f : fb) f = 1.0f + 3.0f * std::abs(f);  // divisors >= 1, as llama3's
      Dev<float> dff(fb), dbq(random_floats(rng, q_w)), dbk(random_floats(rng, kv_w)), dnw(random_floats(rng, s.n_in));
      Dev<int32_t> dpos(std::vector<int32_t>{c.pos});
      const auto mk0 = random_floats(rng, cap * kv_w), mv0 = random_floats(rng, cap * kv_w);
      for (int64_t n_tok : {1, 4, 5}) {  // 4 + 1: the second launch's tokens start at t0 = 4
        const auto x = random_floats(rng, s.n_in * n_tok);
        for (int ks : {1, 2, 4})
          // x as it is; a norm before (the backend's form); x_prepared (Q4_0, Q8_0: the norm
          // quantized x ahead; other types take the norm alone).
          for (int prep : {0, 1, 2}) {
            // mode 0: the products alone; 1: then launch_rope; 2: the rotation in their store.
            const auto run = [&](int mode) {
              Dev<float> dx(x), dh(x.size()), act(x.size()), dq(static_cast<size_t>(n_tok * q_w)),
                  dk(static_cast<size_t>(n_tok * kv_w)), dv(static_cast<size_t>(n_tok * kv_w)), dmk(mk0), dmv(mv0),
                  dsk(static_cast<size_t>(n_tok * kv_w)), dsv(static_cast<size_t>(n_tok * kv_w));
              cuda::NormParams np;
              np.x = dx.p;
              np.y = dh.p;
              np.x_stride = np.y_stride = np.n = s.n_in;
              np.n_rows = n_tok;
              np.w = dnw.p;
              np.eps = 1e-5f;
              const float* in = prep == 0 ? dx.p : dh.p;
              cuda::MatmulParams ps[3] = {product(t, wq.p, s, q_w, in, n_tok, dq.p, act.p),
                                          product(t, wk.p, s, kv_w, in, n_tok, dk.p, act.p),
                                          product(t, wv.p, s, kv_w, in, n_tok, dv.p, act.p)};
              for (cuda::MatmulParams& p : ps) {
                p.ksplit = ks;
                p.type = type;
                if (x8) p.row_bytes = device_row(t, s.n_in);
              }
              if (c.bias) {
                ps[0].bias = dbq.p;
                ps[1].bias = dbk.p;
                ps[0].scale = ps[1].scale = 0.75f;
              }
              if (prep == 1) ps[0].pre_norm = &np;
              if (prep == 2) {
                cuda::MatmulParams first = ps[0];
                first.pre_norm = &np;
                if (!cuda::matmul_reads_q8_0(first) || !cuda::launch_matmul_producer(first)) cuda::launch_norm(np);
                else ps[0].x_prepared = true;
              }
              cuda::RopeLaunch r = rope_of(s, n_tok, dpos.p, dq.p, dk.p, dv.p, dmk.p, dmv.p, dsk.p, dsv.p);
              r.freq_factors = c.freq_factors ? dff.p : nullptr;
              if (c.yarn) {
                r.ext_factor = 1.0f;
                r.freq_scale = 0.25f;
                r.n_ctx_orig = 8192;
              }
              if (mode == 2) {
                EXPECT_TRUE(cuda::matmul_can_rope(ps, 3, r));
                for (cuda::MatmulParams& p : ps) p.rope = &r;
              }
              cuda::launch_matmuls(ps, 3);
              if (mode == 1) cuda::launch_rope(r);
              return std::vector<std::vector<float>>{dq.get(),  dk.get(),  dv.get(), dmk.get(),
                                                     dmv.get(), dsk.get(), dsv.get()};
            };
            const auto sep = run(1), fused = run(2), plain = run(0);
            const std::string where = std::string(ggml_type_name(t)) + (x8 ? " x8" : "") + " head_dim " + std::to_string(s.head_dim) +
                                      " n_rot " + std::to_string(s.n_rot) + " n_tok " + std::to_string(n_tok) +
                                      " ks " + std::to_string(ks) + " prep " + std::to_string(prep);
            const char* names[] = {"q", "k", "v", "mirror k", "mirror v", "staged k", "staged v"};
            for (size_t i = 0; i < sep.size(); ++i)
              EXPECT_EQ(first_diff(fused[i], sep[i]), -1) << names[i] << ": " << where;
            // The rotation ran: q and k differ from the products alone; v is only appended.
            EXPECT_NE(first_diff(fused[0], plain[0]), -1) << where;
            EXPECT_NE(first_diff(fused[1], plain[1]), -1) << where;
            EXPECT_EQ(first_diff(fused[2], plain[2]), -1) << where;
          }
      }
    }
}

// Neox RoPE with the QK-norm before it (qwen3's layers) in the store of a one-token q/k/v
// launch, a head's pairs one thread-block cluster (neox_store), against the products, then
// launch_rope with the norms fused (rope_norm_kernel): bit for bit. Q4_0 rows up to 4096 take
// the narrow rope kernel; shapes: qwen3-30b-a3b's (2048 wide, head 128: clusters of 8 blocks),
// qwen3-8b's and 2560 (whole-warp rows, the second with idle lanes), 768 and 1024 wide (8-lane
// rows: clusters of 4 and 2), a 256-wide head (two float4 a lane in the norm's sums), a v
// narrower than q's heads, and neox without QK-norm; gpt-oss's 2880-wide rows (a partial last
// 8-block group), its 64-wide heads in Q8_0, and in Q4_0. Q8_0, Q4_K, Q5_K and Q6_K as the device
// keeps them, BF16 rows and 8192-wide Q4_0 take the row-pair register kernel (8 warps a block),
// Q4_K and Q5_K q/k with a Q6_K v in one launch of two types (two_type_launch).
TEST(CudaRopeEpilogue, NeoxAndQkNormInTheStoreEqualProductsThenRopeNorm) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(83);
  struct C {
    GgmlType t;
    Shape s;
    int64_t v_dim;
    bool qk_norm;
    int32_t pos;
  };
  const GgmlType q4 = GgmlType::Q4_0;
  const std::vector<C> cases = {{q4, {2048, 32, 4, 128, 128}, 128, true, 37},
                                {q4, {768, 4, 2, 128, 128}, 128, true, 3001},
                                {q4, {1024, 4, 1, 64, 64}, 64, true, 5},
                                {q4, {512, 2, 2, 256, 256}, 256, true, 70},
                                {q4, {2048, 8, 2, 128, 128}, 64, true, 12},
                                {q4, {2048, 8, 2, 128, 128}, 128, false, 9},
                                {q4, {4096, 32, 8, 128, 128}, 128, true, 40},
                                {q4, {2560, 4, 2, 128, 128}, 128, true, 2},
                                {q4, {8192, 4, 2, 128, 128}, 128, true, 11},
                                {GgmlType::Q8_0, {4096, 8, 2, 128, 128}, 128, true, 23},
                                {GgmlType::Q8_0, {1024, 4, 2, 64, 64}, 64, true, 4},
                                {GgmlType::Q4_K, {2048, 8, 4, 128, 128}, 128, true, 31},
                                {GgmlType::Q5_K, {4096, 8, 2, 128, 128}, 128, true, 19},
                                {GgmlType::Q6_K, {4096, 4, 2, 128, 128}, 96, true, 8},
                                {GgmlType::BF16, {2048, 8, 2, 128, 128}, 128, true, 17},
                                {GgmlType::BF16, {1024, 4, 2, 64, 64}, 64, false, 6},
                                {GgmlType::Q8_0, {2880, 64, 8, 64, 64}, 64, false, 40},
                                {q4, {2880, 4, 1, 64, 64}, 64, false, 7}};
  // (c, v's type): each case with v of c.t, then two of another type.
  std::vector<std::pair<C, GgmlType>> all;
  for (const C& c : cases) all.emplace_back(c, c.t);
  all.emplace_back(C{GgmlType::Q4_K, {4096, 8, 2, 128, 128}, 128, true, 21}, GgmlType::Q6_K);
  all.emplace_back(C{GgmlType::Q5_K, {2048, 4, 2, 128, 128}, 128, false, 3}, GgmlType::Q6_K);
  for (const auto& [c, tv] : all) {
    const Shape& s = c.s;
    const int64_t q_w = s.n_head * s.head_dim, k_w = s.n_head_kv * s.head_dim, v_w = s.n_head_kv * c.v_dim;
    const int64_t cap = c.pos + 4;
    const bool x8 = c.t != GgmlType::BF16;
    // Rows as the device keeps them (gpt-oss's 2880: a partial last 8-block group).
    const auto rows = [&](GgmlType t, int64_t n_out) {
      const auto b = random_weight_row(rng, t, s.n_in * n_out);
      return x8 ? device_rows(b, t, s.n_in) : b;
    };
    const auto bq = rows(c.t, q_w), bk = rows(c.t, k_w), bv = rows(tv, v_w);
    Dev<uint8_t> wq(bq), wk(bk), wv(bv);
    const int type = x8 ? to_x8(c.t, wq.p, bq.size(), s.n_in) : static_cast<int>(c.t);
    int type_v = type;
    if (x8) {
      to_x8(c.t, wk.p, bk.size(), s.n_in);
      type_v = to_x8(tv, wv.p, bv.size(), s.n_in);
    }
    Dev<float> dqw(random_floats(rng, s.head_dim)), dkw(random_floats(rng, s.head_dim));
    Dev<int32_t> dpos(std::vector<int32_t>{c.pos});
    const auto x = random_floats(rng, s.n_in), mk0 = random_floats(rng, cap * k_w), mv0 = random_floats(rng, cap * v_w);
    // mode 0: the products alone; 1: then launch_rope (norms fused); 2: all in their store.
    const auto run = [&](int mode) {
      Dev<float> dx(x), act(x.size()), dq(static_cast<size_t>(q_w)), dk(static_cast<size_t>(k_w)),
          dv(static_cast<size_t>(v_w)), dmk(mk0), dmv(mv0), dsk(static_cast<size_t>(k_w)), dsv(static_cast<size_t>(v_w));
      cuda::MatmulParams ps[3] = {product(c.t, wq.p, s, q_w, dx.p, 1, dq.p, act.p),
                                  product(c.t, wk.p, s, k_w, dx.p, 1, dk.p, act.p),
                                  product(tv, wv.p, s, v_w, dx.p, 1, dv.p, act.p)};
      for (cuda::MatmulParams& p : ps) p.type = type;
      ps[2].type = type_v;
      if (x8) {
        ps[0].row_bytes = ps[1].row_bytes = device_row(c.t, s.n_in);
        ps[2].row_bytes = device_row(tv, s.n_in);
      }
      cuda::RopeLaunch r = rope_launch(dq.p, dk.p, 1, s.n_head, s.n_head_kv, s.head_dim, s.n_rot, dpos.p);
      r.neox = true;
      r.freq_base = 1000000.0f;
      rope_append(r, dv.p, v_w, dmk.p, dmv.p, dsk.p, dsv.p);
      const auto norm = [&](float* y, const float* w, int64_t heads) {
        cuda::NormParams n;
        n.x = n.y = y;
        n.x_stride = n.y_stride = n.n = s.head_dim;
        n.n_rows = heads;
        n.w = w;
        n.eps = 1e-6f;
        return n;
      };
      r.qk_norm = c.qk_norm;
      r.norm_x = norm(dq.p, dqw.p, s.n_head);
      r.norm_x2 = norm(dk.p, dkw.p, s.n_head_kv);
      if (mode == 2) {
        EXPECT_TRUE(cuda::matmul_can_rope(ps, 3, r));
        for (cuda::MatmulParams& p : ps) p.rope = &r;
      }
      cuda::launch_matmuls(ps, 3);
      if (mode == 1) cuda::launch_rope(r);
      return std::vector<std::vector<float>>{dq.get(), dk.get(), dv.get(), dmk.get(), dmv.get(), dsk.get(), dsv.get()};
    };
    const auto sep = run(1), fused = run(2), plain = run(0);
    const std::string where = std::string(ggml_type_name(c.t)) + " v " + std::string(ggml_type_name(tv)) + " n_in " + std::to_string(s.n_in) + " head_dim " +
                              std::to_string(s.head_dim) + " v_dim " + std::to_string(c.v_dim) + " qk_norm " +
                              std::to_string(c.qk_norm);
    const char* names[] = {"q", "k", "v", "mirror k", "mirror v", "staged k", "staged v"};
    for (size_t i = 0; i < sep.size(); ++i) EXPECT_EQ(first_diff(fused[i], sep[i]), -1) << names[i] << ": " << where;
    // The rotation (and norm) ran: q and k differ from the products alone; v is only appended.
    EXPECT_NE(first_diff(fused[0], plain[0]), -1) << where;
    EXPECT_NE(first_diff(fused[1], plain[1]), -1) << where;
    EXPECT_EQ(first_diff(fused[2], plain[2]), -1) << where;
  }
  // What the fused store takes and refuses (type: the id products take): partial rotation, a
  // head of more than 8 blocks' pairs (256 wide: 16 on either kernel), of fewer pairs than a
  // block's (8 wide), a type on neither kernel (Q5_K as the file holds it).
  const auto takes = [&](int type, const Shape& s) {
    const int64_t q_w = s.n_head * s.head_dim, k_w = s.n_head_kv * s.head_dim;
    float* f = reinterpret_cast<float*>(uintptr_t{0x100000});
    cuda::MatmulParams ps[3] = {product(q4, f, s, q_w, f, 1, f + 0x10000, f + 0x40000),
                                product(q4, f, s, k_w, f, 1, f + 0x20000, f + 0x40000),
                                product(q4, f, s, k_w, f, 1, f + 0x30000, f + 0x40000)};
    for (cuda::MatmulParams& p : ps) p.type = type;
    cuda::RopeLaunch r = rope_launch(f + 0x10000, f + 0x20000, 1, s.n_head, s.n_head_kv, s.head_dim, s.n_rot,
                                     reinterpret_cast<const int32_t*>(f));
    r.neox = true;
    rope_append(r, f + 0x30000, k_w, f + 0x50000, f + 0x60000, f + 0x70000, f + 0x80000);
    return cuda::matmul_can_rope(ps, 3, r);
  };
  const int q4x8 = 2000 + static_cast<int>(q4), q5k = static_cast<int>(GgmlType::Q5_K);  // 2000 +: x8_type's ids
  EXPECT_TRUE(takes(q4x8, {2048, 8, 2, 128, 128}));
  EXPECT_TRUE(takes(q4x8, {8192, 8, 2, 128, 128}));
  EXPECT_FALSE(takes(q4x8, {4096, 8, 2, 256, 256}));
  EXPECT_FALSE(takes(q4x8, {2048, 8, 2, 128, 64}));
  EXPECT_FALSE(takes(q4x8, {1024, 8, 2, 8, 8}));
  EXPECT_FALSE(takes(q5k, {2048, 8, 2, 128, 128}));
}

// matmul_can_rope on fake (aligned) device addresses: it holds for a decode q/k/v group on the
// stream kernel, and refuses every case launch_rope must keep.
TEST(CudaRopeEpilogue, PredicateRefusesWhatTheStoreCannotDo) {
  const Shape s{4096, 8, 2, 128, 128};
  const int64_t q_w = s.n_head * s.head_dim, kv_w = s.n_head_kv * s.head_dim;
  const auto at = [](uintptr_t a) { return reinterpret_cast<float*>(a); };
  float *x = at(0x100000), *q = at(0x200000), *k = at(0x300000), *v = at(0x400000), *act = at(0x500000);
  const void* w = at(0x600000);
  const auto* pos = reinterpret_cast<const int32_t*>(0x700000);
  const auto group = [&](GgmlType t, int64_t n_tok) {
    return std::vector<cuda::MatmulParams>{product(t, w, s, q_w, x, n_tok, q, act),
                                           product(t, w, s, kv_w, x, n_tok, k, act),
                                           product(t, w, s, kv_w, x, n_tok, v, act)};
  };
  const auto rope = [&](int64_t n_tok) {
    return rope_of(s, n_tok, pos, q, k, v, at(0x800000), at(0x900000), at(0xa00000), at(0xb00000));
  };
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::BF16, GgmlType::F16})
    for (int64_t n_tok : {1, 5, 8}) EXPECT_TRUE(cuda::matmul_can_rope(group(t, n_tok).data(), 3, rope(n_tok)))
                                        << ggml_type_name(t) << " n_tok " << n_tok;
  const auto refuses = [&](const std::string& why, auto&& change) {
    auto ps = group(GgmlType::Q4_0, 1);
    cuda::RopeLaunch r = rope(1);
    int n = 3;
    change(ps, r, n);
    EXPECT_FALSE(cuda::matmul_can_rope(ps.data(), n, r)) << why;
  };
  using Ps = std::vector<cuda::MatmulParams>;
  refuses("prefill", [&](Ps& ps, cuda::RopeLaunch& r, int&) {
    ps = group(GgmlType::Q4_0, 9);
    r = rope(9);
  });
  refuses("neox", [](Ps&, cuda::RopeLaunch& r, int&) { r.neox = true; });
  refuses("QK-norm", [](Ps&, cuda::RopeLaunch& r, int&) { r.qk_norm = true; });
  refuses("no append", [](Ps&, cuda::RopeLaunch& r, int&) { r.mirror_k = nullptr; });
  refuses("odd n_rot", [](Ps&, cuda::RopeLaunch& r, int&) { r.n_rot = 63; });
  refuses("n_rot past the head", [](Ps&, cuda::RopeLaunch& r, int&) { r.n_rot = 130; });
  refuses("no v product", [](Ps&, cuda::RopeLaunch&, int& n) { n = 2; });
  refuses("gated q (y elsewhere)", [&](Ps& ps, cuda::RopeLaunch&, int&) { ps[0].y = act; });
  refuses("q stride", [](Ps& ps, cuda::RopeLaunch&, int&) { ps[0].y_stride += 4; });
  refuses("k width", [](Ps& ps, cuda::RopeLaunch&, int&) { ps[1].n_out -= 2; });
  refuses("unquantized Q4_0 (generic kernel)", [](Ps& ps, cuda::RopeLaunch&, int&) {
    for (auto& p : ps) p.act_round = nullptr;
  });
  refuses("F32 weights", [&](Ps& ps, cuda::RopeLaunch&, int&) { ps = group(GgmlType::F32, 1); });
  refuses("unstaged rows", [](Ps& ps, cuda::RopeLaunch&, int&) {
    ps[2].w = static_cast<const uint8_t*>(ps[2].w) + 2;
  });
  refuses("experts", [&](Ps& ps, cuda::RopeLaunch&, int&) {
    ps[1].slot_expert = pos;
    ps[1].n_slots = 1;
  });
}

}  // namespace
}  // namespace frink::test

#else
TEST(CudaRopeEpilogue, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
