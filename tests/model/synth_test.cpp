// frink synth's plans: every preset has llama.cpp's tensor names and shapes, the type mixes
// follow llama-quantize's rules, weights depend only on (name, seed), and a written file of
// an MoE preset opens with the tensors the plan promised. Running tokens through synthetic
// files is in tests/engine/synth_run_test.cpp.
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "format/model_file.h"
#include "model/synth.h"
#include "quant/quant.h"

namespace frink {
namespace {

using Shape = std::vector<int64_t>;

// By value: callers pass temporaries.
std::map<std::string, SynthTensor> by_name(const SynthPlan& plan) {
  std::map<std::string, SynthTensor> m;
  for (const auto& t : plan.tensors) m[t.name] = t;
  return m;
}

SynthPlan plan(const std::string& preset, const std::string& type, int64_t layers = 0) {
  SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.n_layer = layers;
  return plan_synth(o);
}

void expect_tensor(const std::map<std::string, SynthTensor>& m, const std::string& name, const Shape& ne) {
  auto it = m.find(name);
  ASSERT_NE(it, m.end()) << name << " is missing";
  EXPECT_EQ(it->second.ne, ne) << name;
}

TEST(Synth, EveryPresetPlansAndCountsParameters) {
  // Parameter counts of the real models (embeddings included; tied models count them once).
  const std::map<std::string, std::pair<double, double>> approx_b = {
      {"llama3.2-1b", {1.2, 1.3}},       {"llama3.1-8b", {8.0, 8.1}},   {"qwen3-0.6b", {0.55, 0.65}},
      {"qwen2.5-7b", {7.6, 7.7}},
      {"qwen3-8b", {8.1, 8.3}},          {"qwen3-30b-a3b", {30.4, 30.6}}, {"qwen3-next-80b-a3b", {79, 81.5}},
      {"qwen3.5-9b", {8.9, 9.7}},        {"gpt-oss-20b", {20.8, 21.0}}, {"gemma3-12b", {11.7, 12.0}},
      {"mistral-small-24b", {23.5, 23.7}}, {"deepseek-v2-lite", {15.6, 15.8}}, {"deepseek-v3", {670, 672}},
      {"qwen1.5-moe-a2.7b", {14.2, 14.4}}};
  ASSERT_EQ(synth_presets().size(), approx_b.size());
  for (const auto& p : synth_presets()) {
    const SynthPlan pl = plan(std::string(p.name), "Q4_0");
    const double b = double(pl.n_params()) / 1e9;
    const auto [lo, hi] = approx_b.at(std::string(p.name));
    EXPECT_GE(b, lo) << p.name;
    EXPECT_LE(b, hi) << p.name;
  }
}

TEST(Synth, LlamaLayoutAndRopeFactors) {
  const auto m = by_name(plan("llama3.1-8b", "Q4_0", 2));
  expect_tensor(m, "token_embd.weight", {4096, 128256});
  expect_tensor(m, "output.weight", {4096, 128256});
  expect_tensor(m, "rope_freqs.weight", {64});
  expect_tensor(m, "blk.1.attn_k.weight", {4096, 1024});
  expect_tensor(m, "blk.1.ffn_down.weight", {14336, 4096});
  EXPECT_EQ(m.count("blk.2.attn_q.weight"), 0u);  // --layers 2
  // Tied: llama3.2-1b has no output.weight.
  EXPECT_EQ(by_name(plan("llama3.2-1b", "F16", 1)).count("output.weight"), 0u);
  // The llama3 factors: 1 for the fastest pairs, `factor` (8) for the slowest.
  const SynthPlan pl = plan("llama3.1-8b", "F16", 1);
  for (size_t i = 0; i < pl.tensors.size(); ++i) {
    if (pl.tensors[i].name != "rope_freqs.weight") continue;
    const auto bytes = synth_tensor_bytes(pl, i, 1);
    const float* f = reinterpret_cast<const float*>(bytes.data());
    EXPECT_FLOAT_EQ(f[0], 1.0f);
    EXPECT_FLOAT_EQ(f[63], 8.0f);
    for (int k = 1; k < 64; ++k) EXPECT_GE(f[k], f[k - 1]);
  }
}

TEST(Synth, QwenMoeAndHybridLayoutsMatchLlamaCpp) {
  {
    const auto m = by_name(plan("qwen3-30b-a3b", "Q4_K_M", 1));
    expect_tensor(m, "blk.0.ffn_gate_inp.weight", {2048, 128});
    expect_tensor(m, "blk.0.ffn_gate_exps.weight", {2048, 768, 128});
    expect_tensor(m, "blk.0.ffn_up_exps.weight", {2048, 768, 128});
    expect_tensor(m, "blk.0.ffn_down_exps.weight", {768, 2048, 128});
    expect_tensor(m, "blk.0.attn_q_norm.weight", {128});
    expect_tensor(m, "blk.0.attn_q.weight", {2048, 4096});
    EXPECT_EQ(m.at("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);  // routers stay F32
  }
  {
    // qwen3next: layers 0-2 gated delta net, layer 3 full attention with a gated q.
    const auto m = by_name(plan("qwen3-next-80b-a3b", "Q4_0", 4));
    expect_tensor(m, "blk.0.attn_qkv.weight", {2048, 8192});   // 2*16*128 + 32*128
    expect_tensor(m, "blk.0.attn_gate.weight", {2048, 4096});
    expect_tensor(m, "blk.0.ssm_conv1d.weight", {4, 8192});
    expect_tensor(m, "blk.0.ssm_ba.weight", {2048, 64});
    expect_tensor(m, "blk.0.ssm_a", {32});
    expect_tensor(m, "blk.0.ssm_dt.bias", {32});
    expect_tensor(m, "blk.0.ssm_norm.weight", {128});
    expect_tensor(m, "blk.0.ssm_out.weight", {4096, 2048});
    expect_tensor(m, "blk.0.post_attention_norm.weight", {2048});
    expect_tensor(m, "blk.3.attn_q.weight", {2048, 8192});      // 2 * 16 heads * 256
    expect_tensor(m, "blk.3.attn_k.weight", {2048, 512});
    expect_tensor(m, "blk.3.attn_output.weight", {4096, 2048});
    EXPECT_EQ(m.count("blk.3.ssm_a"), 0u);
    expect_tensor(m, "blk.0.ffn_gate_exps.weight", {2048, 512, 512});
    expect_tensor(m, "blk.0.ffn_gate_inp_shexp.weight", {2048});
    expect_tensor(m, "blk.0.ffn_down_shexp.weight", {512, 2048});
  }
  {
    const auto m = by_name(plan("qwen3.5-9b", "Q8_0", 4));
    expect_tensor(m, "blk.0.ssm_beta.weight", {4096, 32});
    expect_tensor(m, "blk.0.ssm_alpha.weight", {4096, 32});
    expect_tensor(m, "blk.0.ffn_down.weight", {12288, 4096});
    expect_tensor(m, "blk.3.attn_q.weight", {4096, 8192});
    EXPECT_EQ(m.count("blk.0.ssm_ba.weight"), 0u);
  }
}

// DeepSeek-V2-Lite: latent attention in llama.cpp's split layout (no q LoRA), one leading
// dense layer, then 64 experts with two shared ones, and the heads' widths under the _mla keys;
// DeepSeek-V3's q LoRA and routing below.
TEST(Synth, DeepseekLayoutsMatchLlamaCpp) {
  const SynthPlan pl = plan("deepseek-v2-lite", "Q8_0", 2);
  const auto m = by_name(pl);
  expect_tensor(m, "blk.0.attn_q.weight", {2048, 3072});  // 16 heads x (128 + 64)
  expect_tensor(m, "blk.0.attn_kv_a_mqa.weight", {2048, 576});
  expect_tensor(m, "blk.0.attn_kv_a_norm.weight", {512});
  expect_tensor(m, "blk.0.attn_k_b.weight", {128, 512, 16});
  expect_tensor(m, "blk.0.attn_v_b.weight", {512, 128, 16});
  expect_tensor(m, "blk.0.attn_output.weight", {2048, 2048});
  expect_tensor(m, "blk.0.ffn_gate.weight", {2048, 10944});
  expect_tensor(m, "blk.1.ffn_gate_exps.weight", {2048, 1408, 64});
  expect_tensor(m, "blk.1.ffn_down_shexp.weight", {2816, 2048});
  EXPECT_EQ(m.count("blk.0.ffn_gate_exps.weight"), 0u);
  EXPECT_EQ(m.count("blk.1.ffn_gate.weight"), 0u);
  // The cache row's widths and the heads' (arch_deepseek2's read_mla checks one against the
  // other; tests/engine/synth_run_test.cpp loads and runs the file).
  std::map<std::string, int64_t> meta;
  for (const auto& [k, v] : pl.meta)
    if (k.rfind("deepseek2.attention.", 0) == 0 && k.find("length") != std::string::npos) meta[k] = v.as_int();
  EXPECT_EQ(meta["deepseek2.attention.key_length"], 576);
  EXPECT_EQ(meta["deepseek2.attention.value_length"], 512);
  EXPECT_EQ(meta["deepseek2.attention.key_length_mla"], 192);
  EXPECT_EQ(meta["deepseek2.attention.value_length_mla"], 128);
  // DeepSeek-V3: the q LoRA, three dense layers, sigmoid routing with its selection bias over
  // 8 groups keeping 4, one shared expert as wide as a routed one.
  const SynthPlan v3 = plan("deepseek-v3", "Q4_0", 4);
  const auto m3 = by_name(v3);
  expect_tensor(m3, "blk.0.attn_q_a.weight", {7168, 1536});
  expect_tensor(m3, "blk.0.attn_q_a_norm.weight", {1536});
  expect_tensor(m3, "blk.0.attn_q_b.weight", {1536, 24576});  // 128 heads x (128 + 64)
  expect_tensor(m3, "blk.2.ffn_down.weight", {18432, 7168});
  expect_tensor(m3, "blk.3.ffn_gate_exps.weight", {7168, 2048, 256});
  expect_tensor(m3, "blk.3.exp_probs_b.bias", {256});
  expect_tensor(m3, "blk.3.ffn_up_shexp.weight", {7168, 2048});
  EXPECT_EQ(m3.count("blk.0.attn_q.weight"), 0u);
  std::map<std::string, int64_t> routing;
  for (const auto& [k, v] : v3.meta)
    if (k.rfind("deepseek2.expert_g", 0) == 0) routing[k] = v.as_int();
  EXPECT_EQ(routing["deepseek2.expert_gating_func"], 2);
  EXPECT_EQ(routing["deepseek2.expert_group_count"], 8);
  EXPECT_EQ(routing["deepseek2.expert_group_used_count"], 4);
}

// Qwen1.5-MoE-A2.7B (llama.cpp's qwen2moe loader): q/k/v biases and no output bias, 60
// experts, and a shared expert four routed ones wide under a sigmoid gate of one f32 row.
TEST(Synth, Qwen2MoeLayoutMatchesLlamaCpp) {
  const auto m = by_name(plan("qwen1.5-moe-a2.7b", "Q4_0", 1));
  expect_tensor(m, "blk.0.attn_q.bias", {2048});
  expect_tensor(m, "blk.0.attn_k.weight", {2048, 2048});  // 16 kv heads x 128
  expect_tensor(m, "blk.0.ffn_gate_exps.weight", {2048, 1408, 60});
  expect_tensor(m, "blk.0.ffn_down_exps.weight", {1408, 2048, 60});
  expect_tensor(m, "blk.0.ffn_gate_inp.weight", {2048, 60});
  expect_tensor(m, "blk.0.ffn_gate_inp_shexp.weight", {2048});
  expect_tensor(m, "blk.0.ffn_up_shexp.weight", {2048, 5632});
  expect_tensor(m, "blk.0.ffn_down_shexp.weight", {5632, 2048});
  EXPECT_EQ(m.count("blk.0.attn_output.bias"), 0u);
  EXPECT_EQ(m.count("blk.0.ffn_gate.weight"), 0u);
  EXPECT_EQ(m.at("blk.0.ffn_gate_inp_shexp.weight").type, GgmlType::F32);
}

TEST(Synth, GptOssExpertsAreMxfp4) {
  const auto m = by_name(plan("gpt-oss-20b", "MXFP4", 1));
  expect_tensor(m, "blk.0.ffn_gate_exps.weight", {2880, 2880, 32});
  expect_tensor(m, "blk.0.ffn_down_exps.bias", {2880, 32});
  expect_tensor(m, "blk.0.attn_sinks.weight", {64});
  expect_tensor(m, "blk.0.attn_q.weight", {2880, 4096});
  expect_tensor(m, "blk.0.attn_q.bias", {4096});
  EXPECT_EQ(m.at("blk.0.ffn_up_exps.weight").type, GgmlType::MXFP4);
  EXPECT_EQ(m.at("blk.0.attn_k.weight").type, GgmlType::Q8_0);
  // K-quant rows of 2880 are not whole 256-blocks: llama.cpp's fallback (Q4_K -> Q5_0).
  EXPECT_EQ(by_name(plan("gpt-oss-20b", "Q4_K_M", 1)).at("blk.0.attn_k.weight").type, GgmlType::Q5_0);
  EXPECT_THROW(plan("llama3.2-1b", "MXFP4"), Error);  // no experts to put MXFP4 in
}

TEST(Synth, QuantMixFollowsLlamaQuantize) {
  const auto m = by_name(plan("llama3.1-8b", "Q4_K_M"));
  EXPECT_EQ(m.at("output.weight").type, GgmlType::Q6_K);
  EXPECT_EQ(m.at("token_embd.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(m.at("blk.0.attn_v.weight").type, GgmlType::Q6_K);   // first eighth
  EXPECT_EQ(m.at("blk.4.attn_v.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(m.at("blk.6.ffn_down.weight").type, GgmlType::Q6_K); // (6 - 4) % 3 == 2
  EXPECT_EQ(m.at("blk.7.ffn_down.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(m.at("blk.31.ffn_down.weight").type, GgmlType::Q6_K);// last eighth
  EXPECT_EQ(m.at("blk.5.attn_q.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(m.at("blk.5.attn_norm.weight").type, GgmlType::F32);
  // Tied embeddings are the output matrix: Q6_K.
  EXPECT_EQ(by_name(plan("llama3.2-1b", "Q4_K_M")).at("token_embd.weight").type, GgmlType::Q6_K);
  // Pure types put every matrix in that type.
  EXPECT_EQ(by_name(plan("llama3.2-1b", "Q4_0")).at("token_embd.weight").type, GgmlType::Q4_0);
}

// IQ4_XS as llama-quantize mixes it (output Q6_K, attn_v Q5_K at 4+ query heads a KV head, the
// IQ4_NL fallback for widths not of 256), its codes decoding to the drawn weights within a
// 4-bit code book's error.
TEST(Synth, Iq4XsMixAndCodes) {
  const SynthPlan pl = plan("llama3.2-1b", "IQ4_XS", 1);
  const auto m = by_name(pl);
  EXPECT_EQ(m.at("token_embd.weight").type, GgmlType::Q6_K);  // tied: the output
  EXPECT_EQ(m.at("blk.0.attn_v.weight").type, GgmlType::Q5_K);
  EXPECT_EQ(m.at("blk.0.attn_q.weight").type, GgmlType::IQ4_XS);
  EXPECT_EQ(m.at("blk.0.ffn_down.weight").type, GgmlType::IQ4_XS);
  const SynthPlan oss = plan("gpt-oss-20b", "IQ4_XS", 1);
  EXPECT_EQ(by_name(oss).at("blk.0.attn_k.weight").type, GgmlType::IQ4_NL);
  const std::pair<const SynthPlan*, const char*> cases[] = {
      {&pl, "blk.0.attn_q.weight"}, {&pl, "blk.0.ffn_down.weight"}, {&oss, "blk.0.attn_k.weight"}};
  for (const auto& [p, name] : cases) {
    size_t i = 0;
    while (p->tensors[i].name != name) ++i;
    const auto bytes = synth_tensor_bytes(*p, i, 1);
    SynthPlan f32 = *p;  // the same tensor's draws, unencoded
    f32.tensors[i].type = GgmlType::F32;
    const auto ref_bytes = synth_tensor_bytes(f32, i, 1);
    const int64_t n = static_cast<int64_t>(ref_bytes.size() / sizeof(float));
    std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    std::memcpy(ref.data(), ref_bytes.data(), ref_bytes.size());
    dequantize_row(p->tensors[i].type, bytes.data(), got.data(), n);
    double err = 0, sig = 0;
    for (int64_t k = 0; k < n; ++k) err += (got[k] - ref[k]) * double(got[k] - ref[k]), sig += ref[k] * double(ref[k]);
    EXPECT_LT(err / sig, 0.01) << name;  // 0.0061 each (seed 42)
  }
}

TEST(Synth, RefusesWhatItCannotWrite) {
  EXPECT_THROW(plan("llama3.2-1b", "IQ2_XS"), Error);  // no IQ2_XS quantizer in src/quant
  EXPECT_THROW(plan("llama3.2-1b", "Q9_9"), Error);
  EXPECT_THROW(plan("no-such-model", "Q4_0"), Error);
  EXPECT_THROW(plan("qwen3-0.6b", "Q4_0", 29), Error);
}

TEST(Synth, WeightsDependOnNameAndSeedOnly) {
  const SynthPlan a = plan("qwen3-0.6b", "Q8_0", 1), b = plan("qwen3-0.6b", "Q8_0", 2);
  auto index = [](const SynthPlan& p, const std::string& name) {
    for (size_t i = 0; i < p.tensors.size(); ++i)
      if (p.tensors[i].name == name) return i;
    return size_t(-1);
  };
  const std::string name = "blk.0.attn_k.weight";
  const auto one_thread = synth_tensor_bytes(a, index(a, name), 1);
  EXPECT_EQ(one_thread, synth_tensor_bytes(a, index(a, name), 2));
  EXPECT_EQ(one_thread, synth_tensor_bytes(b, index(b, name), 2));
  SynthOptions o;
  o.preset = "qwen3-0.6b";
  o.type = "Q8_0";
  o.n_layer = 1;
  o.seed = 7;
  const SynthPlan c = plan_synth(o);
  EXPECT_NE(one_thread, synth_tensor_bytes(c, index(c, name), 2));
}

TEST(Synth, WrittenMoeFileOpensWithThePlannedTensors) {
  const SynthPlan pl = plan("qwen3-30b-a3b", "Q4_0", 1);
  const auto path = std::filesystem::temp_directory_path() / "frink_synth_test_qwen3moe.gguf";
  write_synth(pl, path.string(), 0);
  {
    const auto mf = ModelFile::open(path.string());
    EXPECT_EQ(mf->metadata().get_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(mf->metadata().get_int("qwen3moe.expert_count"), 128);
    EXPECT_EQ(mf->metadata().get_int("qwen3moe.block_count"), 1);
    ASSERT_EQ(mf->tensors().size(), pl.tensors.size());
    for (const auto& t : pl.tensors) {
      const TensorView* v = mf->find(t.name);
      ASSERT_NE(v, nullptr) << t.name;
      EXPECT_EQ(v->ne, t.ne) << t.name;
      EXPECT_EQ(v->type, t.type) << t.name;
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace frink
