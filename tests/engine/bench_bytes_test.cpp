// frink bench's weight bytes per decode token (bench_model_info), recomputed here from each
// model's tensor list: every tensor once, one row of an untied token_embd, and of a mixture
// of experts' stacked expert tensors (ffn_*_exps and their per-expert biases and scales,
// the expert index outermost) only the k experts a token routes to. k comes from the
// model's own config (config.json's num_experts_per_tok, GGUF's expert_used_count), not
// from frink's layer plan. The SafeTensors fixtures (tests/fixtures/hf/) need nothing
// else; llama.cpp's tiny MoE files (scales, a dense first layer, a shared expert) need
// ../shared/testdata. synth's MoE preset (qwen3-30b-a3b) is not used: even one layer of it
// is ~1.2 B parameters.
#include <cstdint>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/read_file.h"
#include "engine/bench.h"
#include "engine/logits_harness.h"
#include "model/model.h"
#include "support/test_support.h"

namespace frink {
namespace {

struct Expected {
  uint64_t dense = 0;    // non-expert tensors, token_embd as one row when untied
  uint64_t experts = 0;  // all bytes of the expert stacks
  uint64_t active = 0;   // the k-of-n share of them
};

Expected expected_bytes(const Model& m, int64_t k) {
  Expected e;
  const bool tied = m.file->find("output.weight") == nullptr;
  for (const auto& t : m.file->tensors()) {
    if (t.name.find("_exps.") != std::string::npos) {
      const auto n_expert = static_cast<uint64_t>(t.ne.back());
      EXPECT_EQ(t.n_bytes % n_expert, 0u) << t.name;
      e.experts += t.n_bytes;
      e.active += t.n_bytes / n_expert * static_cast<uint64_t>(k);
    } else if (t.name == "token_embd.weight" && !tied) {
      e.dense += t.row_bytes();
    } else {
      e.dense += t.n_bytes;
    }
  }
  return e;
}

std::filesystem::path hf_fixture(const std::string& name) {
  return std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf" / name;
}

class BenchBytesHfMoe : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchBytesHfMoe, ExpertStacksCountTheirActiveShare) {
  const auto dir = hf_fixture(GetParam());
  const int64_t k = nlohmann::json::parse(test::read_text_file(dir / "config.json")).at("num_experts_per_tok");
  const auto m = load_model(dir.string());
  const Expected e = expected_bytes(*m, k);
  ASSERT_GT(e.experts, 0u);
  ASSERT_LT(e.active, e.experts);  // the fixtures route to 2 of 4 experts
  EXPECT_EQ(bench_model_info(*m, 1).weight_bytes_per_token, e.dense + e.active);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BenchBytesHfMoe, ::testing::Values("qwen3_moe", "mixtral", "gpt_oss"), test::param_name);

// llama.cpp's MoE files: per-expert .scale and .input_scale stacks (and gpt-oss's expert
// biases), and deepseek2's dense layer 0 and shared expert.
class BenchBytesGgufMoe : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchBytesGgufMoe, ExpertStacksCountTheirActiveShare) {
  FRINK_REQUIRE_SHARED();
  const auto path = test::shared_testdata() / "llamacpp" / "archs" / fmt::format("{}.gguf", GetParam());
  const auto m = load_model(path.string());
  const auto& meta = m->file->metadata();
  const auto k = meta.try_int(meta.try_string("general.architecture").value_or("") + ".expert_used_count");
  ASSERT_TRUE(k.has_value());
  const Expected e = expected_bytes(*m, *k);
  ASSERT_GT(e.experts, 0u);
  ASSERT_LT(e.active, e.experts);
  EXPECT_EQ(bench_model_info(*m, 1).weight_bytes_per_token, e.dense + e.active);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, BenchBytesGgufMoe,
                         ::testing::Values("llama-moe", "gpt-oss-moe", "deepseek2-moe", "olmoe-moe"), test::param_name);

// Dense models: every tensor whole, but for an untied token_embd's one row (the count
// before MoE was handled, unchanged).
TEST(BenchBytes, DenseModelCountsEveryTensorOnce) {
  for (const char* name : {"llama", "qwen3"}) {  // untied and tied embeddings
    SCOPED_TRACE(name);
    const auto m = load_model(hf_fixture(name).string());
    uint64_t all = 0;
    for (const auto& t : m->file->tensors()) all += t.n_bytes;
    const TensorView* embd = m->file->find("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    const bool tied = m->file->find("output.weight") == nullptr;
    const uint64_t want = tied ? all : all - embd->n_bytes + embd->row_bytes();
    const Expected e = expected_bytes(*m, 0);
    EXPECT_EQ(e.experts, 0u);
    EXPECT_EQ(bench_model_info(*m, 1).weight_bytes_per_token, want);
  }
}

// K/V bytes per position: K and V rows of every attention layer in f32 (n_head_kv heads of
// head_dim from config.json), none for a hybrid's recurrent layers. The tg row's effective
// bandwidth adds them times the mean context on top of the weights.
TEST(BenchBytes, KvBytesCountAttentionLayersOnly) {
  for (const char* name : {"llama", "qwen3_next"}) {
    SCOPED_TRACE(name);
    const auto dir = hf_fixture(name);
    const auto cfg = nlohmann::json::parse(read_file((dir / "config.json").string()));
    const int64_t n_layer = cfg["num_hidden_layers"], n_kv = cfg["num_key_value_heads"];
    const int64_t hd = cfg.contains("head_dim") ? cfg["head_dim"].get<int64_t>()
                                                : cfg["hidden_size"].get<int64_t>() / cfg["num_attention_heads"].get<int64_t>();
    int64_t attn_layers = n_layer;
    if (cfg.contains("layer_types")) {
      attn_layers = 0;
      for (const auto& t : cfg["layer_types"]) attn_layers += t == "full_attention";
    } else if (cfg.contains("full_attention_interval")) {
      attn_layers = n_layer / cfg["full_attention_interval"].get<int64_t>();
    }
    ASSERT_GT(attn_layers, 0);
    const auto m = load_model(dir.string());
    const BenchModelInfo info = bench_model_info(*m, 1);
    EXPECT_EQ(info.kv_bytes_per_position, static_cast<uint64_t>(attn_layers * 2 * n_kv * hd) * sizeof(float));
  }
}

}  // namespace
}  // namespace frink
