// Runs a model the way llama.cpp's fixture harness did: one batched prefill of the prompt
// (logits for every position), then greedy decoding one token at a time, recording the
// logits after each step. Shared by the llama.cpp-oracle tests and the transformers ones.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/decoder.h"
#include "engine/sampler.h"

namespace frink::test {

struct LogitsRun {
  std::vector<float> prefill;       // [n_prompt][n_vocab]
  std::vector<float> decode;        // [n_steps][n_vocab], after feeding greedy[i]
  std::vector<int32_t> greedy;      // argmax chosen at each step (greedy[0] from the prefill)
  int64_t n_vocab = 0;
};

LogitsRun run_logits(const std::string& model_path, const std::vector<int32_t>& prompt, int n_steps,
                     int64_t n_batch = 512);

// A fixture json of llama.cpp's layout: prompt, greedy, prefill_logits, decode_logits.
struct LogitsFixture {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<float> prefill;
  std::vector<float> decode;
  int64_t n_vocab = 0;
};
LogitsFixture read_fixture(const std::filesystem::path& json_path);


// A model run against a fixture of the layout above: NMSE of the prefill and decode logits
// (recorded as test properties, printed with FRINK_TEST_VERBOSE=1) and both greedy lists.
struct OracleCheck {
  double prefill = 0, decode = 0;
  std::vector<int32_t> greedy, expected_greedy;
};
// llama.cpp's file ../shared/testdata/llamacpp/archs/NAME.gguf (and .json, .f32).
OracleCheck check_llamacpp_arch(const std::string& name);
// transformers' fixture tests/fixtures/hf/NAME (a SafeTensors folder with reference.json).
OracleCheck check_hf_fixture(const std::string& name);
// Expects both errors below `bound` and identical greedy tokens.
void expect_matches(const OracleCheck& c, double bound);

// Test-name suffix for a parameter like "llama-dense" ("llama_dense").
std::string param_name(const ::testing::TestParamInfo<const char*>& info);

// Logits of `steps` greedy decode steps after the session's current tokens.
inline std::vector<float> decode_steps(Decoder& dec, Session& s, int32_t first, int steps) {
  std::vector<float> all, step;
  int32_t next = first;
  for (int i = 0; i < steps; ++i) {
    dec.eval(s, {next}, false, step);
    all.insert(all.end(), step.begin(), step.end());
    next = greedy_token(step.data(), static_cast<int64_t>(step.size()));
  }
  return all;
}

}  // namespace frink::test
