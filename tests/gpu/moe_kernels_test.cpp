// MoE kernels on the device: routing, expert products slot by slot (grids, routing in the
// launch, the combine in the down's launch), grouped expert products and the combine, against the
// host or the separate launches they replace.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include "cpu/moe.h"
#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

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

}  // namespace
}  // namespace frink::test

#endif  // FRINK_HAVE_CUDA
