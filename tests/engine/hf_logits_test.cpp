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
TEST_P(HfModel, PrefillDecodeAndGreedyMatchTransformers) { expect_matches(check_hf_fixture(GetParam()), 1e-5); }

INSTANTIATE_TEST_SUITE_P(Transformers, HfModel,
                         ::testing::Values("llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2",
                                           "gemma3"),
                         param_name);

}  // namespace
}  // namespace frink::test
