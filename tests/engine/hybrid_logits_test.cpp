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

class HybridArch : public ::testing::TestWithParam<const char*> {};

// f32 weights on both sides; the differences are summation order, llama.cpp's f16 KV cache
// in the attention layers, and its fused delta-rule op against frink's chunked prefill.
TEST_P(HybridArch, PrefillDecodeAndGreedyMatchLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  expect_matches(check_llamacpp_arch(GetParam()), 1e-6);
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
TEST_P(HybridHfModel, PrefillDecodeAndGreedyMatchTransformers) { expect_matches(check_hf_fixture(GetParam()), 1e-5); }

INSTANTIATE_TEST_SUITE_P(Transformers, HybridHfModel, ::testing::Values("qwen3_next", "qwen3_5"));

}  // namespace
}  // namespace frink::test
