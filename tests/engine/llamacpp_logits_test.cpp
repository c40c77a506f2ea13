// Oracle 1 (DESIGN.md section 6): llama.cpp's own logits for tiny random-weight models of
// each architecture, and for one model quantized to every block type.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "engine/logits_harness.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

class DenseArch : public ::testing::TestWithParam<const char*> {};

// f32 weights: the only differences from llama.cpp are summation order and llama.cpp's f16
// KV cache, both far below 1e-6 in NMSE.
TEST_P(DenseArch, PrefillDecodeAndGreedyMatchLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  expect_matches(check_llamacpp_arch(GetParam()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, DenseArch,
                         ::testing::Values("llama-dense", "qwen2-dense", "qwen3-dense", "mistral3-dense",
                                           "phi3-dense", "gemma2-dense", "bloom-dense"),
                         param_name);

class QuantFile : public ::testing::TestWithParam<const char*> {};

// Our error against llama.cpp must be at most a tenth of llama.cpp's own error between the
// quantized file and its f32 original (DESIGN.md section 6).
TEST_P(QuantFile, WithinATenthOfLlamaCppsQuantizationError) {
  FRINK_REQUIRE_SHARED();
  const auto qdir = shared_testdata() / "llamacpp" / "quant";
  const std::string name = GetParam();
  const std::string base = name.substr(0, name.find('-', name.find('-') + 1));  // llama-dense / qwen3-dense
  LogitsFixture fx = read_fixture(qdir / (name + ".json"));
  LogitsFixture f32 = read_fixture(shared_testdata() / "llamacpp" / "archs" / (base + ".json"));
  ASSERT_EQ(fx.prompt, f32.prompt);
  LogitsRun run = run_logits((qdir / (name + ".gguf")).string(), fx.prompt, static_cast<int>(fx.greedy.size()));
  const double quant_err = nmse(fx.prefill.data(), f32.prefill.data(), fx.prefill.size());
  const double ours = nmse(run.prefill.data(), fx.prefill.data(), fx.prefill.size());
  if (std::getenv("FRINK_TEST_VERBOSE")) std::printf("%s ours %.3g quant %.3g decode ours %.3g\n", name.c_str(), ours, quant_err, nmse(run.decode.data(), fx.decode.data(), fx.decode.size()));
  EXPECT_LE(ours, 0.1 * quant_err) << "prefill: ours " << ours << " vs llama.cpp quantization " << quant_err;
  const double quant_err_d = nmse(fx.decode.data(), f32.decode.data(), fx.decode.size());
  const double ours_d = nmse(run.decode.data(), fx.decode.data(), fx.decode.size());
  // Decode rows follow greedy tokens; when llama.cpp's quantized and f32 runs chose different
  // tokens their decode rows are not comparable, so the bound uses the prefill error then.
  const double bound_d = fx.greedy == f32.greedy ? quant_err_d : quant_err;
  EXPECT_LE(ours_d, 0.1 * bound_d) << "decode: ours " << ours_d << " vs " << bound_d;
  EXPECT_EQ(run.greedy, fx.greedy);
}

INSTANTIATE_TEST_SUITE_P(
    LlamaCpp, QuantFile,
    ::testing::Values("llama-dense-F16", "llama-dense-BF16", "llama-dense-Q4_0", "llama-dense-Q4_1",
                      "llama-dense-Q5_0", "llama-dense-Q5_1", "llama-dense-Q8_0", "llama-dense-Q2_K",
                      "llama-dense-Q3_K_M", "llama-dense-Q4_K_M", "llama-dense-Q5_K_M", "llama-dense-Q6_K",
                      "llama-dense-IQ4_NL", "llama-dense-IQ4_XS", "qwen3-dense-Q4_K_M", "qwen3-dense-Q8_0"),
    param_name);

}  // namespace
}  // namespace frink::test
