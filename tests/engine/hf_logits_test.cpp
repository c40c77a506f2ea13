// Oracle 2 (DESIGN.md section 6): Hugging Face transformers. Tiny random models made by
// tools/make_hf_fixtures.py on the GPU machine (float32, eager attention), loaded here from
// their SafeTensors folders.
#include <gtest/gtest.h>

#include "engine/logits_harness.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

class HfModel : public ::testing::TestWithParam<const char*> {};

// Both sides compute in f32 with different summation orders; 1e-5 NMSE allows that and
// nothing else (a swapped rope pair or a missing norm offset is > 1e-2).
TEST_P(HfModel, PrefillDecodeAndGreedyMatchTransformers) {
  const auto dir = std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf" / GetParam();
  LogitsFixture fx = read_fixture(dir / "reference.json");
  LogitsRun run = run_logits(dir.string(), fx.prompt, static_cast<int>(fx.greedy.size()));
  ASSERT_EQ(run.n_vocab, fx.n_vocab);
  ASSERT_EQ(run.prefill.size(), fx.prefill.size());
  const double e_pre = nmse(run.prefill.data(), fx.prefill.data(), fx.prefill.size());
  const double e_dec = nmse(run.decode.data(), fx.decode.data(), fx.decode.size());
  RecordProperty("nmse_prefill", std::to_string(e_pre));
  RecordProperty("nmse_decode", std::to_string(e_dec));
  EXPECT_LT(e_pre, 1e-5) << "prefill";
  EXPECT_LT(e_dec, 1e-5) << "decode";
  EXPECT_EQ(run.greedy, fx.greedy);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfModel,
                         ::testing::Values("llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2",
                                           "gemma3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace frink::test
