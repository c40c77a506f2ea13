// moe_ffn on quantized experts (MXFP4, Q4_1, Q8_0) against a plain double-precision
// reference that dequantizes each chosen expert's slice of the 3-D tensor, and the batched
// path (tokens grouped by expert) against one token at a time.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "cpu/moe.h"
#include "quant/quant.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

constexpr int64_t kEmbd = 64, kFf = 96, kExpert = 4, kUsed = 2, kTok = 7;

// Random bytes of a block type: every bit pattern decodes to some value; MXFP4 shared
// exponents (each block's first byte) kept near 2^-4 so values stay O(1).
std::vector<uint8_t> random_blocks(GgmlType t, int64_t n_elem, std::mt19937& rng) {
  std::vector<uint8_t> b(ggml_row_bytes(t, n_elem));
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  if (t == GgmlType::MXFP4)
    for (size_t i = 0; i < b.size(); i += 17) b[i] = static_cast<uint8_t>(120 + rng() % 4);
  return b;
}

std::vector<uint8_t> quantized(GgmlType t, const std::vector<float>& v) {
  std::vector<uint8_t> b(ggml_row_bytes(t, static_cast<int64_t>(v.size())));
  quantize_row(t, v.data(), b.data(), static_cast<int64_t>(v.size()));
  return b;
}

struct Fixture {
  std::mt19937 rng{7};
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;  // reserved up front: Experts hold pointers into it
  std::vector<float> router, h;
  LayerPlan plan;
  LayerWeights w;

  const TensorView* add(GgmlType t, std::vector<int64_t> ne, std::vector<uint8_t> b) {
    bytes.push_back(std::move(b));
    views.push_back(TensorView{"t", t, std::move(ne), bytes.back().data(), bytes.back().size()});
    return &views.back();
  }

  Fixture() {
    views.reserve(8);
    bytes.reserve(8);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> gate(kEmbd * kFf * kExpert);
    for (auto& v : gate) v = 0.2f * nd(rng);
    router.resize(kEmbd * kExpert);
    for (auto& v : router) v = nd(rng);
    h.resize(kTok * kEmbd);
    for (auto& v : h) v = nd(rng);
    plan.ffn = FfnKind::kMoe;
    plan.moe.n_expert = kExpert;
    plan.moe.n_expert_used = kUsed;
    plan.moe.n_ff_exp = kFf;
    plan.moe.norm_w = true;
    w.ffn_gate_inp.w = add(GgmlType::F32, {kEmbd, kExpert},
                           std::vector<uint8_t>(reinterpret_cast<uint8_t*>(router.data()),
                                                reinterpret_cast<uint8_t*>(router.data() + router.size())));
    // Three block types, two activation formats (Q8_0 for MXFP4/Q8_0, Q8_1 for Q4_1).
    w.ffn_gate_exps.w = add(GgmlType::MXFP4, {kEmbd, kFf, kExpert}, random_blocks(GgmlType::MXFP4, kEmbd * kFf * kExpert, rng));
    w.ffn_up_exps.w = add(GgmlType::Q4_1, {kEmbd, kFf, kExpert}, quantized(GgmlType::Q4_1, gate));
    w.ffn_down_exps.w = add(GgmlType::Q8_0, {kFf, kEmbd, kExpert}, quantized(GgmlType::Q8_0, gate));
  }
};

// Expert e's row r of a 3-D expert tensor, dequantized.
std::vector<float> expert_row(const TensorView& t, int64_t e, int64_t r) {
  std::vector<float> v(static_cast<size_t>(t.ne[0]));
  dequantize_row(t.type, t.row(e * t.ne[1] + r), v.data(), t.ne[0]);
  return v;
}

std::vector<double> reference(const Fixture& f, const float* x) {
  std::vector<float> logits(kExpert);
  for (int64_t e = 0; e < kExpert; ++e) {
    double s = 0;
    for (int64_t i = 0; i < kEmbd; ++i) s += static_cast<double>(f.router[e * kEmbd + i]) * x[i];
    logits[e] = static_cast<float>(s);
  }
  int32_t chosen[kUsed];
  float wt[kUsed];
  cpu::route_token(f.plan.moe, logits.data(), nullptr, chosen, wt);
  std::vector<double> out(kEmbd, 0.0);
  for (int64_t j = 0; j < kUsed; ++j) {
    const int64_t e = chosen[j];
    std::vector<double> hid(kFf);
    for (int64_t r = 0; r < kFf; ++r) {
      const auto g = expert_row(*f.w.ffn_gate_exps.w, e, r), u = expert_row(*f.w.ffn_up_exps.w, e, r);
      double gs = 0, us = 0;
      for (int64_t i = 0; i < kEmbd; ++i) gs += g[i] * static_cast<double>(x[i]), us += u[i] * static_cast<double>(x[i]);
      hid[r] = gs / (1 + std::exp(-gs)) * us;
    }
    for (int64_t d = 0; d < kEmbd; ++d) {
      const auto dn = expert_row(*f.w.ffn_down_exps.w, e, d);
      double s = 0;
      for (int64_t r = 0; r < kFf; ++r) s += dn[r] * hid[r];
      out[d] += wt[j] * s;
    }
  }
  return out;
}

TEST(MoeFfn, QuantizedExpertsMatchADequantizedReference) {
  Fixture f;
  ThreadPool pool(3);
  std::vector<float> out(kTok * kEmbd);
  cpu::moe_ffn(f.plan, f.w, f.h.data(), kTok, kEmbd, out.data(), pool);
  std::vector<float> ref;
  for (int64_t t = 0; t < kTok; ++t)
    for (double v : reference(f, f.h.data() + t * kEmbd)) ref.push_back(static_cast<float>(v));
  // The only difference is the activation rounded to 8-bit blocks before each dot (Q8_0 /
  // Q8_1, step = block max / 127), three times in a row: x before gate and up (about 3e-5
  // each), then the heavy-tailed silu(g) * u rows before down. Measured 1.35e-4 on this
  // case (x86-64, AVX2); a wrong expert's slice, or a token given another's slot, is O(1).
  EXPECT_LT(nmse(out.data(), ref.data(), ref.size()), 1e-3);
}

TEST(MoeFfn, BatchEqualsOneTokenAtATime) {
  Fixture f;
  ThreadPool pool(3);
  std::vector<float> batch(kTok * kEmbd), single(kTok * kEmbd);
  cpu::moe_ffn(f.plan, f.w, f.h.data(), kTok, kEmbd, batch.data(), pool);
  for (int64_t t = 0; t < kTok; ++t)
    cpu::moe_ffn(f.plan, f.w, f.h.data() + t * kEmbd, 1, kEmbd, single.data() + t * kEmbd, pool);
  // Same dots in the same order per token: bit-identical.
  EXPECT_EQ(0, std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)));
}

}  // namespace
}  // namespace frink::test
