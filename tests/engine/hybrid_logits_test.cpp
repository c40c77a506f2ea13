// Hybrid recurrent models (gated delta net: qwen3next, qwen35, qwen35moe; Mamba-2:
// granitehybrid) against llama.cpp's logits for its tiny random files
// (testdata/llamacpp/archs/), and rewinding a hybrid session through its snapshots.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "engine/decoder.h"
#include "engine/logits_harness.h"
#include "engine/rewind.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

std::string param_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (auto& c : n)
    if (c == '-') c = '_';
  return n;
}

class HybridArch : public ::testing::TestWithParam<const char*> {};

// f32 weights on both sides; the differences are summation order, llama.cpp's f16 KV cache
// in the attention layers, and its fused delta-rule op against frink's chunked prefill.
TEST_P(HybridArch, PrefillDecodeAndGreedyMatchLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "llamacpp" / "archs";
  const std::string name = GetParam();
  LogitsFixture fx = read_fixture(dir / (name + ".json"));
  LogitsRun run = run_logits((dir / (name + ".gguf")).string(), fx.prompt, static_cast<int>(fx.greedy.size()));
  ASSERT_EQ(run.n_vocab, fx.n_vocab);
  ASSERT_EQ(run.prefill.size(), fx.prefill.size());
  ASSERT_EQ(run.decode.size(), fx.decode.size());
  const double e_pre = nmse(run.prefill.data(), fx.prefill.data(), fx.prefill.size());
  const double e_dec = nmse(run.decode.data(), fx.decode.data(), fx.decode.size());
  RecordProperty("nmse_prefill", std::to_string(e_pre));
  RecordProperty("nmse_decode", std::to_string(e_dec));
  if (std::getenv("FRINK_TEST_VERBOSE")) std::printf("%s nmse prefill %.3g decode %.3g\n", name.c_str(), e_pre, e_dec);
  EXPECT_LT(e_pre, 1e-6) << "prefill";
  EXPECT_LT(e_dec, 1e-6) << "decode";
  EXPECT_EQ(run.greedy, fx.greedy);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, HybridArch,
                         ::testing::Values("qwen3next-moe", "qwen35-dense", "qwen35moe-moe", "granitehybrid-dense"),
                         param_name);

}  // namespace
}  // namespace frink::test

namespace frink::test {
namespace {

class HybridHfModel : public ::testing::TestWithParam<const char*> {};

// transformers' reference logits (tests/fixtures/hf, from ONE uncached forward pass each).
// Both sides compute in f32 with different summation orders and delta-rule formulations
// (frink's chunked prefill and recurrent decode, transformers' chunked full pass), which
// stays near 1e-12; 1e-5 leaves room for nothing else (a wrong head mapping or norm offset
// costs > 1e-3).
TEST_P(HybridHfModel, PrefillDecodeAndGreedyMatchTransformers) {
  const auto dir = std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf" / GetParam();
  LogitsFixture fx = read_fixture(dir / "reference.json");
  LogitsRun run = run_logits(dir.string(), fx.prompt, static_cast<int>(fx.greedy.size()));
  ASSERT_EQ(run.n_vocab, fx.n_vocab);
  ASSERT_EQ(run.prefill.size(), fx.prefill.size());
  ASSERT_EQ(run.decode.size(), fx.decode.size());
  const double e_pre = nmse(run.prefill.data(), fx.prefill.data(), fx.prefill.size());
  const double e_dec = nmse(run.decode.data(), fx.decode.data(), fx.decode.size());
  RecordProperty("nmse_prefill", std::to_string(e_pre));
  RecordProperty("nmse_decode", std::to_string(e_dec));
  if (std::getenv("FRINK_TEST_VERBOSE")) std::printf("%s nmse prefill %.3g decode %.3g\n", GetParam(), e_pre, e_dec);
  EXPECT_LT(e_pre, 1e-5) << "prefill";
  EXPECT_LT(e_dec, 1e-5) << "decode";
  EXPECT_EQ(run.greedy, fx.greedy);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HybridHfModel, ::testing::Values("qwen3_next", "qwen3_5"));

}  // namespace
}  // namespace frink::test
