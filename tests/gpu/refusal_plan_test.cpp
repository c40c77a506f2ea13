// The device's refusal predicate (cuda::device_refusal) on the llama.cpp model files. It is
// pure (no device call), so it runs wherever the CUDA code is built, GPU or not: CI checks
// it. Each layer gets the reason its kind should get: Mamba-2 layers kRecurrent (the host
// runs them), latent attention kShape, and every kind the device runs (windows, ALiBi, sinks,
// softcaps, mixtures of experts, gated attention, whole-projection QK norm, gated delta nets)
// kNone.
// Each feature is asserted present in its file, so the test cannot pass vacuously.
#include <string>

#include <gtest/gtest.h>

#include "gpu_support.h"
#include "model/model.h"

#ifdef FRINK_HAVE_CUDA
#include "cuda/device_weights.h"

namespace frink::test {
namespace {

Refusal expected(const LayerPlan& p) {
  if (p.recurrent == RecurrentKind::kMamba2) return Refusal::kRecurrent;
  if (p.attn == AttnKind::kMla) return Refusal::kShape;
  if (p.ffn == FfnKind::kMoe && p.moe.n_group > 1 && p.moe.n_group_used < p.moe.n_group) return Refusal::kMoe;
  return Refusal::kNone;
}

TEST(DeviceRefusalPlan, EachLayerKindGetsItsReason) {
  FRINK_REQUIRE_SHARED();
  struct Seen {
    int window = 0, alibi = 0, sinks = 0, moe = 0, gated = 0, qk_norm_full = 0, delta_net = 0, recurrent = 0, mla = 0,
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
      if (r != Refusal::kNone) {
        seen.recurrent += r == Refusal::kRecurrent;
        seen.mla += p.attn == AttnKind::kMla;
        continue;
      }
      ++seen.ran;
      seen.window += p.window > 0;
      seen.alibi += p.alibi;
      seen.sinks += p.attn_sinks;
      seen.moe += p.ffn == FfnKind::kMoe;
      seen.gated += p.attn_out_gate;
      seen.qk_norm_full += p.qk_norm_full;
      seen.delta_net += p.recurrent == RecurrentKind::kGatedDeltaNet;
    }
    EXPECT_EQ(refusal_name(cuda::device_refusal(*m, m->hp.n_layer)), refusal_name(Refusal::kNone)) << name << " head";
  }
  // Every kind the device now runs appeared on it at least once, and the host kinds refused.
  EXPECT_GT(seen.window, 0);
  EXPECT_GT(seen.alibi, 0);
  EXPECT_GT(seen.sinks, 0);
  EXPECT_GT(seen.moe, 0);
  EXPECT_GT(seen.gated, 0);
  EXPECT_GT(seen.qk_norm_full, 0);
  EXPECT_GT(seen.delta_net, 0);
  EXPECT_GT(seen.recurrent, 0);
  EXPECT_GT(seen.mla, 0);
  std::printf("[plan] device runs %d layers of the llama.cpp files (%d gated delta nets); %d recurrent and %d "
              "latent-attention refuse\n",
              seen.ran, seen.delta_net, seen.recurrent, seen.mla);
}

}  // namespace
}  // namespace frink::test

#else
TEST(DeviceRefusalPlan, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
