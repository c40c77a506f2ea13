// The device's refusal predicate (cuda::device_refusal) on the llama.cpp model files. It is
// pure (no device call), so it runs wherever the CUDA code is built, GPU or not: CI checks
// it. Every layer kind of the llama.cpp files runs on the device (kNone): windows, ALiBi, sinks,
// softcaps, mixtures of experts, gated attention, whole-projection QK norm, gated delta nets,
// Mamba-2, latent attention.
// Each feature is asserted present in its file, so the test cannot pass vacuously.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"
#include "model/model.h"

#ifdef FRINK_HAVE_CUDA
#include "cuda/device_weights.h"

namespace frink::test {
namespace {

Refusal expected(const LayerPlan& p) {
  return Refusal::kNone;
}

TEST(DeviceRefusalPlan, EachLayerKindGetsItsReason) {
  FRINK_REQUIRE_SHARED();
  struct Seen {
    int window = 0, alibi = 0, sinks = 0, moe = 0, gated = 0, qk_norm_full = 0, delta_net = 0, mamba2 = 0, mla = 0,
        ran = 0;
  } seen;
  for (const char* name : {"llama-dense", "qwen2-dense", "qwen3-dense", "mistral3-dense", "phi3-dense", "gemma2-dense",
                           "bloom-dense", "llama-moe", "qwen3moe-moe", "olmoe-moe", "gpt-oss-moe", "deepseek2-moe",
                           "qwen3next-moe", "qwen35-dense", "qwen35moe-moe", "granitehybrid-dense"}) {
    const auto path = shared_testdata() / "llamacpp" / "archs" / (std::string(name) + ".gguf");
    if (!std::filesystem::exists(path)) continue;
    const auto m = load_model(path.string());
    for (int64_t il = 0; il < m->hp.n_layer; ++il) {
      const LayerPlan& p = m->hp.layers[static_cast<size_t>(il)];
      const Refusal r = cuda::device_refusal(*m, il);
      EXPECT_EQ(refusal_name(r), refusal_name(expected(p))) << name << " layer " << il;
      if (r != Refusal::kNone) continue;
      ++seen.ran;
      seen.window += p.window > 0;
      seen.alibi += p.alibi;
      seen.sinks += p.attn_sinks;
      seen.moe += p.ffn == FfnKind::kMoe;
      seen.gated += p.attn_out_gate;
      seen.qk_norm_full += p.qk_norm_full;
      seen.delta_net += p.recurrent == RecurrentKind::kGatedDeltaNet;
      seen.mamba2 += p.recurrent == RecurrentKind::kMamba2;
      seen.mla += p.attn == AttnKind::kMla;
    }
    EXPECT_EQ(refusal_name(cuda::device_refusal(*m, m->hp.n_layer)), refusal_name(Refusal::kNone)) << name << " head";
  }
  // Every kind the device runs appeared on it at least once.
  EXPECT_GT(seen.window, 0);
  EXPECT_GT(seen.alibi, 0);
  EXPECT_GT(seen.sinks, 0);
  EXPECT_GT(seen.moe, 0);
  EXPECT_GT(seen.gated, 0);
  EXPECT_GT(seen.qk_norm_full, 0);
  EXPECT_GT(seen.delta_net, 0);
  EXPECT_GT(seen.mamba2, 0);
  EXPECT_GT(seen.mla, 0);
  std::printf("[plan] device runs %d layers of the llama.cpp files (%d gated delta nets, %d Mamba-2, %d latent "
              "attention)\n",
              seen.ran, seen.delta_net, seen.mamba2, seen.mla);
}

Refusal placed_as(const std::vector<Refusal>& r, int64_t il) { return r[static_cast<size_t>(il)]; }

// Where a model's weights go when device memory is short or -ngl limits them (place_layers),
// from what each layer's upload takes (DeviceWeights::upload_bytes, counted without a device):
// everything where it fits; else every attention layer's K/V mirror and two slots of the
// largest layer first (the layers left on the host are lent to prompt batches), then the head,
// then the last layers down. A refusal of another kind keeps its reason and takes no memory.
// Pure, so CI checks it.
TEST(DevicePlacement, TheHeadThenTheLastLayersThatFit) {
  FRINK_REQUIRE_SHARED();
  // stories260K: 5 attention layers; granite: a Mamba-2 layer after an attention one; deepseek2:
  // latent attention, whose mirror is one 576-float row a token.
  for (const auto& path : {shared_testdata() / "models" / "stories260K.gguf",
                           shared_testdata() / "llamacpp" / "archs" / "granitehybrid-dense.gguf",
                           shared_testdata() / "llamacpp" / "archs" / "deepseek2-moe.gguf"}) {
    const std::string name = path.stem().string();
    const auto m = load_model(path.string());
    const int64_t n = m->hp.n_layer;
    ASSERT_GE(n, 2);
    const std::vector<size_t> bytes = cuda::DeviceWeights::upload_bytes(*m);
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), n + 1);
    std::vector<Refusal> own;
    for (int64_t il = 0; il <= n; ++il) {
      own.push_back(cuda::device_refusal(*m, il));
      const LayerWeights& w = il < n ? m->w.layers[static_cast<size_t>(il)] : LayerWeights{};
      size_t mats = 0;  // its matrices at least: the upload counts them with norms and vectors
      for (const Linear* l : {&w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_gate, &w.ffn_up, &w.ffn_down})
        if (*l) mats += l->w->n_bytes;
      if (il == n) mats = m->w.output.w->n_bytes;
      if (own.back() == Refusal::kNone) {
        EXPECT_GE(bytes[static_cast<size_t>(il)], mats) << name << " layer " << il;
      } else {
        EXPECT_EQ(bytes[static_cast<size_t>(il)], 0u) << name << " layer " << il;  // never uploaded
      }
    }
    // The device's layers' mirrors at n_ctx, the largest layer, and everything.
    const auto mirrors = [&](int64_t n_ctx) {
      size_t sum = 0;
      for (int64_t il = 0; il < n; ++il) {
        const LayerPlan& p = m->hp.layers[static_cast<size_t>(il)];
        if (own[static_cast<size_t>(il)] == Refusal::kNone)
          sum += static_cast<size_t>(n_ctx * (p.cache_k_width() + p.cache_v_width())) * sizeof(float);
      }
      return sum;
    };
    const size_t largest = *std::max_element(bytes.begin(), bytes.end() - 1);
    size_t all = mirrors(256);
    for (const size_t b : bytes) all += b;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {}), own) << name << ": room for everything";
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.budget_bytes = all, .n_ctx = 256}), own) << name;
    std::vector<Refusal> none = own;
    for (Refusal& r : none)
      if (r == Refusal::kNone) r = Refusal::kMemory;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.budget_bytes = 0}), none) << name;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.n_gpu_layers = n + 1}), own) << name;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.n_gpu_layers = 0}), none) << name;
    // -ngl 1: the last device layer alone, the head on the host.
    std::vector<Refusal> last = none;
    int64_t last_il = n - 1;
    while (last_il > 0 && own[static_cast<size_t>(last_il)] != Refusal::kNone) --last_il;
    ASSERT_EQ(own[static_cast<size_t>(last_il)], Refusal::kNone) << name;
    last[static_cast<size_t>(last_il)] = Refusal::kNone;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.n_gpu_layers = 1}), last) << name;
    // At a context 64 times longer the same bytes hold fewer layers: the mirrors count.
    const auto placed = [](const std::vector<Refusal>& r) { return std::count(r.begin(), r.end(), Refusal::kNone); };
    EXPECT_LT(placed(cuda::place_layers(*m, bytes, {.budget_bytes = all, .n_ctx = 256 * 64})), placed(own)) << name;
    if (std::count(own.begin(), own.end() - 1, Refusal::kNone) < 3) continue;  // two slots hold two layers
    // Memory for the lending (every mirror, two slots of the largest layer), the head and exactly
    // the last layer; and a byte less.
    const size_t fit = mirrors(256) + 2 * largest + bytes.back() + bytes[static_cast<size_t>(last_il)];
    ASSERT_LT(fit, all) << name;
    std::vector<Refusal> head_and_last = last;
    head_and_last.back() = Refusal::kNone;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.budget_bytes = fit, .n_ctx = 256}), head_and_last) << name;
    std::vector<Refusal> head_only = none;
    head_only.back() = Refusal::kNone;
    EXPECT_EQ(cuda::place_layers(*m, bytes, {.budget_bytes = fit - 1, .n_ctx = 256}), head_only) << name;
  }
}

}  // namespace
}  // namespace frink::test

#else
TEST(DeviceRefusalPlan, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
