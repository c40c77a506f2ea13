#include "model/synth.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/quant.h"

namespace frink {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Dimensions from each model's config.json on the Hugging Face hub (text model only).
const std::vector<SynthPreset> kPresets = {
    {.name = "llama3.2-1b", .arch = "llama", .model = "Llama-3.2-1B", .family = SynthFamily::kLlama,
     .n_layer = 16, .n_embd = 2048, .n_head = 32, .n_head_kv = 8, .head_dim = 64, .n_ff = 8192,
     .n_vocab = 128256, .n_ctx = 131072, .n_rot = 64, .rope_base = 500000, .norm_eps = 1e-5, .tied = true,
     .llama3_factor = 32, .rope_orig_ctx = 8192},
    {.name = "llama3.1-8b", .arch = "llama", .model = "Llama-3.1-8B", .family = SynthFamily::kLlama,
     .n_layer = 32, .n_embd = 4096, .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336,
     .n_vocab = 128256, .n_ctx = 131072, .n_rot = 128, .rope_base = 500000, .norm_eps = 1e-5, .tied = false,
     .llama3_factor = 8, .rope_orig_ctx = 8192},
    // Qwen2.5-7B: widths of partial K-quant tiles (3584 and 18944 are 14 and 74 super-blocks).
    {.name = "qwen2.5-7b", .arch = "qwen2", .model = "Qwen2.5-7B", .family = SynthFamily::kQwen2,
     .n_layer = 28, .n_embd = 3584, .n_head = 28, .n_head_kv = 4, .head_dim = 128, .n_ff = 18944,
     .n_vocab = 152064, .n_ctx = 32768, .n_rot = 128, .rope_base = 1e6, .norm_eps = 1e-6, .tied = false},
    {.name = "qwen3-0.6b", .arch = "qwen3", .model = "Qwen3-0.6B", .family = SynthFamily::kQwen3,
     .n_layer = 28, .n_embd = 1024, .n_head = 16, .n_head_kv = 8, .head_dim = 128, .n_ff = 3072,
     .n_vocab = 151936, .n_ctx = 40960, .n_rot = 128, .rope_base = 1e6, .norm_eps = 1e-6, .tied = true},
    {.name = "qwen3-8b", .arch = "qwen3", .model = "Qwen3-8B", .family = SynthFamily::kQwen3,
     .n_layer = 36, .n_embd = 4096, .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 12288,
     .n_vocab = 151936, .n_ctx = 40960, .n_rot = 128, .rope_base = 1e6, .norm_eps = 1e-6, .tied = false},
    {.name = "qwen3-30b-a3b", .arch = "qwen3moe", .model = "Qwen3-30B-A3B", .family = SynthFamily::kQwen3Moe,
     .n_layer = 48, .n_embd = 2048, .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144,
     .n_vocab = 151936, .n_ctx = 40960, .n_rot = 128, .rope_base = 1e6, .norm_eps = 1e-6, .tied = false,
     .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {.name = "qwen1.5-moe-a2.7b", .arch = "qwen2moe", .model = "Qwen1.5-MoE-A2.7B", .family = SynthFamily::kQwen2Moe,
     .n_layer = 24, .n_embd = 2048, .n_head = 16, .n_head_kv = 16, .head_dim = 128, .n_ff = 5632,
     .n_vocab = 151936, .n_ctx = 8192, .n_rot = 128, .rope_base = 1e6, .norm_eps = 1e-6, .tied = false,
     .n_expert = 60, .n_expert_used = 4, .n_ff_exp = 1408, .n_ff_shexp = 5632},
    {.name = "qwen3-next-80b-a3b", .arch = "qwen3next", .model = "Qwen3-Next-80B-A3B", .family = SynthFamily::kQwen3Next,
     .n_layer = 48, .n_embd = 2048, .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_ff = 5120,
     .n_vocab = 151936, .n_ctx = 262144, .n_rot = 64, .rope_base = 1e7, .norm_eps = 1e-6, .tied = false,
     .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512, .n_ff_shexp = 512,
     .full_attn_interval = 4, .ssm_conv = 4, .ssm_state = 128, .ssm_groups = 16, .ssm_v_heads = 32},
    {.name = "qwen3.5-9b", .arch = "qwen35", .model = "Qwen3.5-9B", .family = SynthFamily::kQwen35,
     .n_layer = 32, .n_embd = 4096, .n_head = 16, .n_head_kv = 4, .head_dim = 256, .n_ff = 12288,
     .n_vocab = 248320, .n_ctx = 262144, .n_rot = 64, .rope_base = 1e7, .norm_eps = 1e-6, .tied = false,
     .full_attn_interval = 4, .ssm_conv = 4, .ssm_state = 128, .ssm_groups = 16, .ssm_v_heads = 32},
    {.name = "gpt-oss-20b", .arch = "gpt-oss", .model = "gpt-oss-20b", .family = SynthFamily::kGptOss,
     .n_layer = 24, .n_embd = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880,
     .n_vocab = 201088, .n_ctx = 131072, .n_rot = 64, .rope_base = 150000, .norm_eps = 1e-5, .tied = false,
     .rope_orig_ctx = 4096, .rope_scaling = "yarn", .rope_scaling_factor = 32, .sliding_window = 128,
     .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880},
    {.name = "gemma3-12b", .arch = "gemma3", .model = "gemma-3-12b", .family = SynthFamily::kGemma3,
     .n_layer = 48, .n_embd = 3840, .n_head = 16, .n_head_kv = 8, .head_dim = 256, .n_ff = 15360,
     .n_vocab = 262208, .n_ctx = 131072, .n_rot = 256, .rope_base = 1e6, .norm_eps = 1e-6, .tied = true,
     .rope_scaling = "linear", .rope_scaling_factor = 8, .sliding_window = 1024},
    {.name = "deepseek-v2-lite", .arch = "deepseek2", .model = "DeepSeek-V2-Lite", .family = SynthFamily::kDeepseek2,
     .n_layer = 27, .n_embd = 2048, .n_head = 16, .n_head_kv = 1, .head_dim = 128, .n_ff = 10944,
     .n_vocab = 102400, .n_ctx = 163840, .n_rot = 64, .rope_base = 10000, .norm_eps = 1e-6, .tied = false,
     .rope_orig_ctx = 4096, .rope_scaling = "yarn", .rope_scaling_factor = 40,
     .n_expert = 64, .n_expert_used = 6, .n_ff_exp = 1408,
     .kv_lora_rank = 512, .n_leading_dense = 1, .n_shared_exp = 2, .yarn_log_mul = 0.0707},
    {.name = "deepseek-v3", .arch = "deepseek2", .model = "DeepSeek-V3", .family = SynthFamily::kDeepseek2,
     .n_layer = 61, .n_embd = 7168, .n_head = 128, .n_head_kv = 1, .head_dim = 128, .n_ff = 18432,
     .n_vocab = 129280, .n_ctx = 163840, .n_rot = 64, .rope_base = 10000, .norm_eps = 1e-6, .tied = false,
     .rope_orig_ctx = 4096, .rope_scaling = "yarn", .rope_scaling_factor = 40,
     .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 2048,
     .kv_lora_rank = 512, .q_lora_rank = 1536, .n_leading_dense = 3, .n_shared_exp = 1, .yarn_log_mul = 0.1,
     .expert_gating = 2, .expert_norm = true, .expert_scale = 2.5, .n_expert_group = 8, .n_expert_group_used = 4},
    {.name = "mistral-small-24b", .arch = "mistral3", .model = "Mistral-Small-3.1-24B", .family = SynthFamily::kLlama,
     .n_layer = 40, .n_embd = 5120, .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 32768,
     .n_vocab = 131072, .n_ctx = 131072, .n_rot = 128, .rope_base = 1e9, .norm_eps = 1e-5, .tied = false},
};

// ---- the requested type ----------------------------------------------------------------

struct TypeSpec {
  GgmlType base;
  bool mix = false;    // llama.cpp's *_K_M rules
  bool mxfp4 = false;  // experts MXFP4, other matrices Q8_0
  uint32_t ftype = 0;  // general.file_type (llama_ftype)
};

TypeSpec parse_type(std::string t) {
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::toupper(c); });
  if (t == "Q4_K_M") return {GgmlType::Q4_K, true, false, 15};
  if (t == "Q5_K_M") return {GgmlType::Q5_K, true, false, 17};
  if (t == "MXFP4" || t == "MXFP4_MOE") return {GgmlType::Q8_0, false, true, 38};
  // llama.cpp's IQ4_XS mix (LLAMA_FTYPE_MOSTLY_IQ4_XS), its codes by encode_iq4 (no IQ4 quantizer
  // in src/quant).
  if (t == "IQ4_XS") return {GgmlType::IQ4_XS, false, false, 30};
  const auto g = ggml_type_from_name(t);
  if (!g) fail("unknown type '{}' (F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, MXFP4, ...)", t);
  if (!can_quantize(*g) || *g == GgmlType::Q8_1 || *g == GgmlType::Q8_K)
    fail("frink's quant layer cannot write {} tensors yet; pick another --type", t);
  uint32_t ftype = 0;
  switch (*g) {
    case GgmlType::F32: ftype = 0; break;
    case GgmlType::F16: ftype = 1; break;
    case GgmlType::Q4_0: ftype = 2; break;
    case GgmlType::Q4_1: ftype = 3; break;
    case GgmlType::Q8_0: ftype = 7; break;
    case GgmlType::Q5_0: ftype = 8; break;
    case GgmlType::Q5_1: ftype = 9; break;
    case GgmlType::Q4_K: ftype = 14; break;  // Q4_K_S: the nearest ftype to a pure Q4_K file
    case GgmlType::Q5_K: ftype = 16; break;
    case GgmlType::Q6_K: ftype = 18; break;
    case GgmlType::BF16: ftype = 32; break;
    default: ftype = 1024; break;            // LLAMA_FTYPE_GUESSED
  }
  return {*g, false, false, ftype};
}

// llama.cpp's use_more_bits (llama-quant.cpp): the first and last eighth, and every third
// layer between, get Q6_K in the *_K_M mixes.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama.cpp's fallback when a row is not a whole number of K-quant blocks (gpt-oss's 2880).
GgmlType fit_row(GgmlType t, int64_t ne0) {
  if (ne0 % ggml_type_info(t).block_elems == 0) return t;
  switch (t) {
    case GgmlType::Q4_K: t = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: t = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: t = GgmlType::Q8_0; break;
    case GgmlType::IQ4_XS: t = GgmlType::IQ4_NL; break;
    default: t = GgmlType::F16; break;
  }
  return ne0 % ggml_type_info(t).block_elems == 0 ? t : GgmlType::F16;
}

// ---- the tensor list ------------------------------------------------------------------

class PlanBuilder {
 public:
  PlanBuilder(const SynthPreset& p, const TypeSpec& ts, int64_t n_layer, SynthPlan& out)
      : p_(p), ts_(ts), L_(n_layer), out_(out) {}

  // A weight matrix {n_in, n_out[, n_expert]} read as an input projection (unit output
  // variance for a unit input) or an output projection (scaled down by depth).
  void in_proj(const std::string& name, std::vector<int64_t> ne, int64_t layer) {
    add_matrix(name, ne, layer, static_cast<float>(1.0 / std::sqrt(double(ne[0]))));
  }
  void out_proj(const std::string& name, std::vector<int64_t> ne, int64_t layer) {
    add_matrix(name, ne, layer, static_cast<float>(0.5 / std::sqrt(double(ne[0]) * double(L_))));
  }
  // Kept in F32 whatever the type, as llama-quantize does (1-D tensors, the MoE router, the
  // 4-wide conv kernel).
  void f32(const std::string& name, std::vector<int64_t> ne, float mean, float std) {
    out_.tensors.push_back({name, std::move(ne), GgmlType::F32, SynthInit::kNormal, mean, std});
  }
  void norm(const std::string& name, int64_t n) { f32(name, {n}, 1.0f, 0.02f); }
  void bias(const std::string& name, int64_t n) { f32(name, {n}, 0.0f, 0.02f); }

  void io_head() {
    const float s = static_cast<float>(1.0 / std::sqrt(double(p_.n_embd)));
    add_matrix("token_embd.weight", {p_.n_embd, p_.n_vocab}, -1, s, p_.tied);
  }
  void io_tail() {
    norm("output_norm.weight", p_.n_embd);
    if (!p_.tied)
      add_matrix("output.weight", {p_.n_embd, p_.n_vocab}, -1,
                 static_cast<float>(1.0 / std::sqrt(double(p_.n_embd))), true);
  }

  int64_t n_layer() const { return L_; }

 private:
  void add_matrix(const std::string& name, std::vector<int64_t> ne, int64_t layer, float std,
                  bool is_output = false) {
    GgmlType t = ts_.base;
    SynthInit init = SynthInit::kNormal;
    const bool experts = name.find("_exps.") != std::string::npos;
    if (ts_.mxfp4) {
      if (experts) t = GgmlType::MXFP4, init = SynthInit::kMxfp4;
    } else if (ts_.mix) {
      // llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q{4,5}_K_M.
      if (is_output) {
        t = GgmlType::Q6_K;
      } else if (name.find("attn_v.weight") != std::string::npos) {
        if (use_more_bits(n_attn_v_, n_attn_v_total())) t = GgmlType::Q6_K;
        ++n_attn_v_;
      } else if (name.find("ffn_down") != std::string::npos) {
        if (use_more_bits(layer, L_)) t = GgmlType::Q6_K;
      } else if (name.find("attn_qkv.weight") != std::string::npos && ts_.base == GgmlType::Q4_K) {
        t = GgmlType::Q5_K;
      }
    } else if (ts_.base == GgmlType::IQ4_XS) {
      // llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_IQ4_XS: the output Q6_K, attn_v Q5_K where
      // four or more query heads share a KV head.
      if (is_output) t = GgmlType::Q6_K;
      else if (name.find("attn_v.weight") != std::string::npos && p_.n_head >= 4 * p_.n_head_kv) t = GgmlType::Q5_K;
    }
    if (init != SynthInit::kMxfp4) t = fit_row(t, ne[0]);
    out_.tensors.push_back({name, std::move(ne), t, init, 0.0f, std});
  }
  int64_t n_attn_v_total() const {
    if (p_.full_attn_interval == 0) return L_;
    int64_t n = 0;
    for (int64_t il = 0; il < L_; ++il) n += (il + 1) % p_.full_attn_interval == 0;
    return n;
  }

  const SynthPreset& p_;
  const TypeSpec& ts_;
  int64_t L_;
  SynthPlan& out_;
  int64_t n_attn_v_ = 0;
};

std::string blk_name(int64_t il, const char* what) { return fmt::format("blk.{}.{}", il, what); }

// q (optionally twice as wide: query + output gate), k, v, output, optional q/k norms; biases
// on q, k, v (qwen2's), and on the output too where out_bias (gpt-oss's).
void attention_tensors(PlanBuilder& b, const SynthPreset& p, int64_t il, bool gated_q, bool qk_norm, bool bias,
                       bool out_bias = false) {
  const int64_t q = p.n_head * p.head_dim, kv = p.n_head_kv * p.head_dim;
  b.in_proj(blk_name(il, "attn_q.weight"), {p.n_embd, gated_q ? 2 * q : q}, il);
  b.in_proj(blk_name(il, "attn_k.weight"), {p.n_embd, kv}, il);
  b.in_proj(blk_name(il, "attn_v.weight"), {p.n_embd, kv}, il);
  if (bias) {
    b.bias(blk_name(il, "attn_q.bias"), q);
    b.bias(blk_name(il, "attn_k.bias"), kv);
    b.bias(blk_name(il, "attn_v.bias"), kv);
  }
  b.out_proj(blk_name(il, "attn_output.weight"), {q, p.n_embd}, il);
  if (out_bias) b.bias(blk_name(il, "attn_output.bias"), p.n_embd);
  if (qk_norm) {
    b.norm(blk_name(il, "attn_q_norm.weight"), p.head_dim);
    b.norm(blk_name(il, "attn_k_norm.weight"), p.head_dim);
  }
}

void dense_ffn(PlanBuilder& b, const SynthPreset& p, int64_t il) {
  b.in_proj(blk_name(il, "ffn_gate.weight"), {p.n_embd, p.n_ff}, il);
  b.in_proj(blk_name(il, "ffn_up.weight"), {p.n_embd, p.n_ff}, il);
  b.out_proj(blk_name(il, "ffn_down.weight"), {p.n_ff, p.n_embd}, il);
}

void expert_ffn(PlanBuilder& b, const SynthPreset& p, int64_t il, bool bias) {
  const int64_t E = p.n_expert, F = p.n_ff_exp;
  b.f32(blk_name(il, "ffn_gate_inp.weight"), {p.n_embd, E}, 0.0f, static_cast<float>(1.0 / std::sqrt(double(p.n_embd))));
  b.in_proj(blk_name(il, "ffn_gate_exps.weight"), {p.n_embd, F, E}, il);
  b.in_proj(blk_name(il, "ffn_up_exps.weight"), {p.n_embd, F, E}, il);
  b.out_proj(blk_name(il, "ffn_down_exps.weight"), {F, p.n_embd, E}, il);
  if (bias) {
    b.f32(blk_name(il, "ffn_gate_inp.bias"), {E}, 0.0f, 0.02f);
    b.f32(blk_name(il, "ffn_gate_exps.bias"), {F, E}, 0.0f, 0.02f);
    b.f32(blk_name(il, "ffn_up_exps.bias"), {F, E}, 0.0f, 0.02f);
    b.f32(blk_name(il, "ffn_down_exps.bias"), {p.n_embd, E}, 0.0f, 0.02f);
  }
}

// A shared expert n_ff_shexp wide with its sigmoid gate (qwen2moe, qwen3next).
void shared_expert(PlanBuilder& b, const SynthPreset& p, int64_t il) {
  b.f32(blk_name(il, "ffn_gate_inp_shexp.weight"), {p.n_embd}, 0.0f,
        static_cast<float>(1.0 / std::sqrt(double(p.n_embd))));
  b.in_proj(blk_name(il, "ffn_gate_shexp.weight"), {p.n_embd, p.n_ff_shexp}, il);
  b.in_proj(blk_name(il, "ffn_up_shexp.weight"), {p.n_embd, p.n_ff_shexp}, il);
  b.out_proj(blk_name(il, "ffn_down_shexp.weight"), {p.n_ff_shexp, p.n_embd}, il);
}

// Gated delta net layer (llama.cpp's qwen3next / qwen35 loaders, non-legacy layout:
// attn_qkv + attn_gate). qwen3next fuses beta|alpha in ssm_ba; qwen35 keeps them apart.
void delta_net_tensors(PlanBuilder& b, const SynthPreset& p, int64_t il) {
  const int64_t key_dim = p.ssm_state * p.ssm_groups, value_dim = p.ssm_state * p.ssm_v_heads;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  b.in_proj(blk_name(il, "attn_qkv.weight"), {p.n_embd, conv_dim}, il);
  b.in_proj(blk_name(il, "attn_gate.weight"), {p.n_embd, value_dim}, il);
  b.f32(blk_name(il, "ssm_conv1d.weight"), {p.ssm_conv, conv_dim}, 0.0f, 0.5f);
  b.f32(blk_name(il, "ssm_dt.bias"), {p.ssm_v_heads}, 1.0f, 0.1f);
  b.f32(blk_name(il, "ssm_a"), {p.ssm_v_heads}, -4.0f, 0.5f);  // -exp(A_log): negative
  if (p.family == SynthFamily::kQwen3Next) {
    b.in_proj(blk_name(il, "ssm_ba.weight"), {p.n_embd, 2 * p.ssm_v_heads}, il);
  } else {
    b.in_proj(blk_name(il, "ssm_beta.weight"), {p.n_embd, p.ssm_v_heads}, il);
    b.in_proj(blk_name(il, "ssm_alpha.weight"), {p.n_embd, p.ssm_v_heads}, il);
  }
  b.norm(blk_name(il, "ssm_norm.weight"), p.ssm_state);
  b.out_proj(blk_name(il, "ssm_out.weight"), {value_dim, p.n_embd}, il);
}

// DeepSeek-2: latent attention in the split layout llama.cpp runs with absorption (attn_k_b /
// attn_v_b per head), leading dense layers, then routed experts with always-on shared ones.
void deepseek2_tensors(PlanBuilder& b, const SynthPreset& p, int64_t il) {
  const int64_t E = p.n_embd, H = p.n_head, nope = p.head_dim, dk = nope + p.n_rot, R = p.kv_lora_rank;
  const int64_t Q = p.q_lora_rank;
  b.norm(blk_name(il, "attn_norm.weight"), E);
  if (Q > 0) {
    b.in_proj(blk_name(il, "attn_q_a.weight"), {E, Q}, il);
    b.norm(blk_name(il, "attn_q_a_norm.weight"), Q);
    b.in_proj(blk_name(il, "attn_q_b.weight"), {Q, H * dk}, il);
  } else {
    b.in_proj(blk_name(il, "attn_q.weight"), {E, H * dk}, il);
  }
  b.in_proj(blk_name(il, "attn_kv_a_mqa.weight"), {E, R + p.n_rot}, il);
  b.norm(blk_name(il, "attn_kv_a_norm.weight"), R);
  b.in_proj(blk_name(il, "attn_k_b.weight"), {nope, R, H}, il);
  b.in_proj(blk_name(il, "attn_v_b.weight"), {R, p.head_dim, H}, il);
  b.out_proj(blk_name(il, "attn_output.weight"), {H * p.head_dim, E}, il);
  b.norm(blk_name(il, "ffn_norm.weight"), E);
  if (il < p.n_leading_dense) {
    dense_ffn(b, p, il);
    return;
  }
  expert_ffn(b, p, il, false);
  if (p.expert_gating == 2) b.f32(blk_name(il, "exp_probs_b.bias"), {p.n_expert}, 0.0f, 0.02f);
  const int64_t S = p.n_ff_exp * p.n_shared_exp;
  b.in_proj(blk_name(il, "ffn_gate_shexp.weight"), {E, S}, il);
  b.in_proj(blk_name(il, "ffn_up_shexp.weight"), {E, S}, il);
  b.out_proj(blk_name(il, "ffn_down_shexp.weight"), {S, E}, il);
}

void layer_tensors(PlanBuilder& b, const SynthPreset& p, int64_t il) {
  switch (p.family) {
    case SynthFamily::kDeepseek2:
      deepseek2_tensors(b, p, il);
      return;
    case SynthFamily::kLlama:
    case SynthFamily::kQwen2:
    case SynthFamily::kQwen3:
    case SynthFamily::kQwen3Moe:
      b.norm(blk_name(il, "attn_norm.weight"), p.n_embd);
      attention_tensors(b, p, il, false, p.family == SynthFamily::kQwen3 || p.family == SynthFamily::kQwen3Moe,
                        p.family == SynthFamily::kQwen2);
      b.norm(blk_name(il, "ffn_norm.weight"), p.n_embd);
      if (p.family == SynthFamily::kQwen3Moe) expert_ffn(b, p, il, false); else dense_ffn(b, p, il);
      return;
    case SynthFamily::kGemma3:
      b.norm(blk_name(il, "attn_norm.weight"), p.n_embd);
      attention_tensors(b, p, il, false, true, false);
      b.norm(blk_name(il, "post_attention_norm.weight"), p.n_embd);
      b.norm(blk_name(il, "ffn_norm.weight"), p.n_embd);
      dense_ffn(b, p, il);
      b.norm(blk_name(il, "post_ffw_norm.weight"), p.n_embd);
      return;
    case SynthFamily::kQwen2Moe:
      b.norm(blk_name(il, "attn_norm.weight"), p.n_embd);
      attention_tensors(b, p, il, false, false, true);
      b.norm(blk_name(il, "ffn_norm.weight"), p.n_embd);
      expert_ffn(b, p, il, false);
      shared_expert(b, p, il);
      return;
    case SynthFamily::kQwen3Next:
    case SynthFamily::kQwen35: {
      b.norm(blk_name(il, "attn_norm.weight"), p.n_embd);
      b.norm(blk_name(il, "post_attention_norm.weight"), p.n_embd);
      const bool recurrent = (il + 1) % p.full_attn_interval != 0;
      if (recurrent) delta_net_tensors(b, p, il); else attention_tensors(b, p, il, true, true, false);
      if (p.family == SynthFamily::kQwen35) {
        dense_ffn(b, p, il);
        return;
      }
      expert_ffn(b, p, il, false);
      shared_expert(b, p, il);
      return;
    }
    case SynthFamily::kGptOss:
      b.norm(blk_name(il, "attn_norm.weight"), p.n_embd);
      attention_tensors(b, p, il, false, false, true, true);
      b.f32(blk_name(il, "attn_sinks.weight"), {p.n_head}, 0.0f, 0.5f);
      b.norm(blk_name(il, "post_attention_norm.weight"), p.n_embd);
      expert_ffn(b, p, il, true);
      return;
  }
}

// ---- metadata -------------------------------------------------------------------------

MetaValue u32(int64_t v) { return MetaValue::of_int(GgufType::UINT32, v); }
MetaValue f32v(double v) { return MetaValue::of_float(GgufType::FLOAT32, v); }
MetaValue str(std::string_view s) { return MetaValue::of_string(std::string(s)); }

void hparam_meta(const SynthPreset& p, const TypeSpec& ts, int64_t L, SynthPlan& out) {
  auto set = [&](std::string k, MetaValue v) { out.meta.emplace_back(std::move(k), std::move(v)); };
  auto key = [&](std::string_view suffix) { return fmt::format("{}.{}", p.arch, suffix); };
  set("general.architecture", str(p.arch));
  set("general.name", str(fmt::format("{} (synthetic, frink synth)", p.model)));
  set("general.file_type", u32(ts.ftype));
  set("general.quantization_version", u32(2));
  set(key("block_count"), u32(L));
  set(key("context_length"), u32(p.n_ctx));
  set(key("embedding_length"), u32(p.n_embd));
  set(key("feed_forward_length"), u32(p.n_ff));
  set(key("attention.head_count"), u32(p.n_head));
  set(key("attention.head_count_kv"), u32(p.n_head_kv));
  // DeepSeek-2's cache row with absorption: key_length [c | k_pe], value_length c; the heads'
  // own widths go under the _mla keys (convert_hf_to_gguf.py's DeepseekV2Model).
  const bool mla = p.family == SynthFamily::kDeepseek2;
  set(key("attention.key_length"), u32(mla ? p.kv_lora_rank + p.n_rot : p.head_dim));
  set(key("attention.value_length"), u32(mla ? p.kv_lora_rank : p.head_dim));
  set(key("attention.layer_norm_rms_epsilon"), f32v(p.norm_eps));
  set(key("rope.freq_base"), f32v(p.rope_base));
  set(key("rope.dimension_count"), u32(p.n_rot));
  set(key("vocab_size"), u32(p.n_vocab));
  if (!p.rope_scaling.empty()) {
    set(key("rope.scaling.type"), str(p.rope_scaling));
    set(key("rope.scaling.factor"), f32v(p.rope_scaling_factor));
    if (p.rope_orig_ctx) set(key("rope.scaling.original_context_length"), u32(p.rope_orig_ctx));
  }
  if (p.sliding_window) set(key("attention.sliding_window"), u32(p.sliding_window));
  if (p.n_expert) {
    set(key("expert_count"), u32(p.n_expert));
    set(key("expert_used_count"), u32(p.n_expert_used));
    set(key("expert_feed_forward_length"), u32(p.n_ff_exp));
  }
  if (p.n_ff_shexp) set(key("expert_shared_feed_forward_length"), u32(p.n_ff_shexp));
  if (p.full_attn_interval) {
    set(key("full_attention_interval"), u32(p.full_attn_interval));
    set(key("ssm.conv_kernel"), u32(p.ssm_conv));
    set(key("ssm.state_size"), u32(p.ssm_state));
    set(key("ssm.group_count"), u32(p.ssm_groups));
    set(key("ssm.time_step_rank"), u32(p.ssm_v_heads));
    set(key("ssm.inner_size"), u32(p.ssm_state * p.ssm_v_heads));
  }
  if (mla) {
    set(key("attention.key_length_mla"), u32(p.head_dim + p.n_rot));
    set(key("attention.value_length_mla"), u32(p.head_dim));
    set(key("attention.kv_lora_rank"), u32(p.kv_lora_rank));
    if (p.q_lora_rank > 0) set(key("attention.q_lora_rank"), u32(p.q_lora_rank));
    set(key("leading_dense_block_count"), u32(std::min(p.n_leading_dense, L)));  // --layers may cut them
    set(key("expert_shared_count"), u32(p.n_shared_exp));
    set(key("expert_weights_scale"), f32v(p.expert_scale));
    set(key("expert_weights_norm"), MetaValue::of_bool(p.expert_norm));
    set(key("expert_gating_func"), u32(p.expert_gating));
    if (p.n_expert_group > 0) {
      set(key("expert_group_count"), u32(p.n_expert_group));
      set(key("expert_group_used_count"), u32(p.n_expert_group_used));
    }
    set(key("rope.scaling.yarn_log_multiplier"), f32v(p.yarn_log_mul));
  }
  if (p.family == SynthFamily::kQwen35) {  // Qwen3.5's mrope_section [11, 11, 10], padded to 4
    MetaValue::Array s;
    for (int v : {11, 11, 10, 0}) s.push_back(MetaValue::of_int(GgufType::INT32, v));
    set(key("rope.dimension_sections"), MetaValue::of_array(GgufType::INT32, std::move(s)));
  }
}

// A SentencePiece ("llama") vocabulary of n_vocab tokens: <unk>, <s>, </s>, the 256 byte
// tokens (any text encodes through byte fallback), then unique filler pieces.
void tokenizer_meta(const SynthPreset& p, SynthPlan& out) {
  auto set = [&](std::string k, MetaValue v) { out.meta.emplace_back(std::move(k), std::move(v)); };
  MetaValue::Array tokens, scores, types;
  tokens.reserve(size_t(p.n_vocab));
  scores.reserve(size_t(p.n_vocab));
  types.reserve(size_t(p.n_vocab));
  auto add = [&](std::string text, int type) {
    scores.push_back(MetaValue::of_float(GgufType::FLOAT32, -double(tokens.size())));
    tokens.push_back(MetaValue::of_string(std::move(text)));
    types.push_back(MetaValue::of_int(GgufType::INT32, type));
  };
  add("<unk>", 2);  // UNKNOWN
  add("<s>", 3);    // CONTROL
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 6);  // BYTE
  while (int64_t(tokens.size()) < p.n_vocab) add(fmt::format("\u2581synth{}", tokens.size()), 1);
  set("tokenizer.ggml.model", str("llama"));
  set("tokenizer.ggml.tokens", MetaValue::of_array(GgufType::STRING, std::move(tokens)));
  set("tokenizer.ggml.scores", MetaValue::of_array(GgufType::FLOAT32, std::move(scores)));
  set("tokenizer.ggml.token_type", MetaValue::of_array(GgufType::INT32, std::move(types)));
  set("tokenizer.ggml.unknown_token_id", u32(0));
  set("tokenizer.ggml.bos_token_id", u32(1));
  set("tokenizer.ggml.eos_token_id", u32(2));
  set("tokenizer.ggml.add_bos_token", MetaValue::of_bool(true));
  set("tokenizer.ggml.add_eos_token", MetaValue::of_bool(false));
}

// ---- drawing the numbers --------------------------------------------------------------

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {  // FNV-1a: weights depend on the name, not the order
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// One row's values: mean + std * z, z approximately N(0, 1) as the (centred, scaled) sum of
// four 16-bit uniforms from one 64-bit draw (Irwin-Hall; tails end at 3.46 sigma, which
// random weights do not miss, and it is ~5x cheaper than Box-Muller).
void draw_row(uint64_t row_seed, float mean, float std, float* out, int64_t n) {
  uint64_t state = row_seed;
  const float k = std * static_cast<float>(std::sqrt(3.0) / 65536.0);
  for (int64_t i = 0; i < n; ++i) {
    state += 0x9E3779B97F4A7C15ull;
    const uint64_t x = mix64(state);
    const int64_t s = int64_t(x & 0xFFFF) + int64_t((x >> 16) & 0xFFFF) + int64_t((x >> 32) & 0xFFFF) +
                      int64_t(x >> 48) - 2 * 65535;
    out[i] = mean + k * static_cast<float>(s);
  }
}

// MXFP4 blocks (ggml's block_mxfp4: one E8M0 exponent, 32 E2M1 nibbles) from the row's
// values, by ggml's reference rule: exponent from the block's absolute maximum, nearest code.
void encode_mxfp4(const float* x, uint8_t* dst, int64_t n) {
  static constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int64_t b = 0; b < n / 32; ++b, x += 32, dst += 17) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const int e = amax > 0 ? std::clamp(int(std::floor(std::log2(amax))) - 2 + 127, 2, 254) : 0;
    const float d = e >= 2 ? std::ldexp(1.0f, e - 128) : 0.0f;  // GGML_E8M0_TO_FP32_HALF
    auto code = [&](float v) {
      int best = 0;
      float best_err = INFINITY;
      for (int c = 0; c < 16; ++c) {
        const float err = std::fabs(v - (d > 0 ? kValues[c] * d : 0.0f));
        if (err < best_err) best_err = err, best = c;
      }
      return best;
    };
    dst[0] = static_cast<uint8_t>(e);
    for (int i = 0; i < 16; ++i) dst[1 + i] = static_cast<uint8_t>(code(x[i]) | (code(x[i + 16]) << 4));
  }
}

// IQ4_XS (super-blocks of 256: a 6-bit scale a 32-element piece) or IQ4_NL (blocks of 32) codes
// of the row's values: ggml's layout and first guess (a piece's scale its absolute maximum over
// the code book's -127, the super-block's d the largest scale over -32), each value the nearest
// code. Not ggml's quantizer, which searches 15 scales a piece: enough for random weights,
// whose bytes and speed are what synth files are for.
void encode_iq4(GgmlType type, const float* x, uint8_t* dst, int64_t n) {
  using quant::BlockIQ4_NL, quant::BlockIQ4_XS, quant::kIq4nlValues;
  const auto nearest = [](float v) {
    int best = 0;
    for (int c = 1; c < 16; ++c)
      if (std::fabs(v - kIq4nlValues[c]) < std::fabs(v - kIq4nlValues[best])) best = c;
    return best;
  };
  // Piece j's scale: the value of largest magnitude over -127 (so it takes code 0).
  const auto piece_scale = [](const float* p) {
    float m = 0;
    for (int i = 0; i < 32; ++i) m = std::fabs(p[i]) > std::fabs(m) ? p[i] : m;
    return m / static_cast<float>(kIq4nlValues[0]);
  };
  const auto codes = [&](const float* p, float dl, uint8_t* qs) {
    const float id = dl != 0 ? 1.0f / dl : 0.0f;
    for (int i = 0; i < 16; ++i)
      qs[i] = static_cast<uint8_t>(nearest(p[i] * id) | (nearest(p[i + 16] * id) << 4));
  };
  if (type == GgmlType::IQ4_NL) {
    auto* b = reinterpret_cast<BlockIQ4_NL*>(dst);
    for (int64_t k = 0; k < n / 32; ++k, x += 32) {
      b[k].d = f32_to_f16(piece_scale(x));
      codes(x, f16_to_f32(b[k].d), b[k].qs);
    }
    return;
  }
  auto* b = reinterpret_cast<BlockIQ4_XS*>(dst);
  for (int64_t k = 0; k < n / 256; ++k, x += 256) {
    float s[8], max_s = 0;
    for (int j = 0; j < 8; ++j) {
      s[j] = piece_scale(x + 32 * j);
      max_s = std::fabs(s[j]) > std::fabs(max_s) ? s[j] : max_s;
    }
    b[k].d = f32_to_f16(-max_s / 32);
    const float d = f16_to_f32(b[k].d), id = d != 0 ? 1.0f / d : 0.0f;
    b[k].scales_h = 0;
    for (int j = 0; j < 4; ++j) b[k].scales_l[j] = 0;
    for (int j = 0; j < 8; ++j) {
      const int l = std::clamp(static_cast<int>(std::lround(id * s[j])), -32, 31) + 32;
      b[k].scales_l[j / 2] |= static_cast<uint8_t>((l & 0xF) << 4 * (j % 2));
      b[k].scales_h |= static_cast<uint16_t>((l >> 4) << 2 * j);
      codes(x + 32 * j, d * (l - 32), b[k].qs + 16 * j);
    }
  }
}

// convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors (rope_freqs for llama3 scaling).
void llama3_rope_factors(const SynthPreset& p, float* out, int64_t n) {
  const double low_wavelen = double(p.rope_orig_ctx) / p.llama3_low;
  const double high_wavelen = double(p.rope_orig_ctx) / p.llama3_high;
  for (int64_t i = 0; i < n; ++i) {
    const double freq = 1.0 / std::pow(p.rope_base, double(2 * i) / double(p.n_rot));
    const double wavelen = 2 * kPi / freq;
    double f = 1.0;
    if (wavelen > low_wavelen) {
      f = p.llama3_factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (double(p.rope_orig_ctx) / wavelen - p.llama3_low) / (p.llama3_high - p.llama3_low);
      f = 1.0 / ((1 - smooth) / p.llama3_factor + smooth);
    }
    out[i] = static_cast<float>(f);
  }
}

int64_t n_elements(const std::vector<int64_t>& ne) {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

size_t tensor_bytes(const SynthTensor& t) { return ggml_row_bytes(t.type, t.ne[0]) * size_t(n_elements(t.ne) / t.ne[0]); }

// Generates and encodes tensor `t` into dst, rows spread over n_threads threads.
void fill_tensor(const SynthPlan& plan, const SynthTensor& t, uint8_t* dst, int n_threads) {
  const int64_t ne0 = t.ne[0], n_rows = n_elements(t.ne) / ne0;
  const size_t row_bytes = ggml_row_bytes(t.type, ne0);
  if (t.init == SynthInit::kRopeFreqs) {
    llama3_rope_factors(*plan.preset, reinterpret_cast<float*>(dst), ne0);
    return;
  }
  const uint64_t base = mix64(plan.seed ^ name_hash(t.name));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / ne0);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::vector<float> row(static_cast<size_t>(ne0));
    for (int64_t r0; (r0 = next.fetch_add(grain)) < n_rows;) {
      for (int64_t r = r0; r < std::min(n_rows, r0 + grain); ++r) {
        draw_row(mix64(base + uint64_t(r)), t.mean, t.std, row.data(), ne0);
        uint8_t* out = dst + size_t(r) * row_bytes;
        if (t.init == SynthInit::kMxfp4) encode_mxfp4(row.data(), out, ne0);
        else if (t.type == GgmlType::IQ4_XS || t.type == GgmlType::IQ4_NL) encode_iq4(t.type, row.data(), out, ne0);
        else quantize_row(t.type, row.data(), out, ne0);
      }
    }
  };
  const int64_t n_chunks = (n_rows + grain - 1) / grain;
  const int n_workers = static_cast<int>(std::min<int64_t>(n_threads, n_chunks));
  std::vector<std::thread> threads;
  for (int i = 1; i < n_workers; ++i) threads.emplace_back(work);
  work();
  for (auto& th : threads) th.join();
}

int resolve_threads(int n) {
  if (n > 0) return n;
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

const std::vector<SynthPreset>& synth_presets() { return kPresets; }

const SynthPreset* find_synth_preset(std::string_view name) {
  for (const auto& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t SynthPlan::n_params() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += n_elements(t.ne);
  return n;
}

size_t SynthPlan::n_bytes() const {
  size_t n = 0;
  for (const auto& t : tensors) n += tensor_bytes(t);
  return n;
}

SynthPlan plan_synth(const SynthOptions& opts) {
  const SynthPreset* p = find_synth_preset(opts.preset);
  if (!p) {
    std::string names;
    for (const auto& q : kPresets) names += fmt::format("{}{}", names.empty() ? "" : ", ", q.name);
    fail("unknown preset '{}' (one of: {})", opts.preset, names);
  }
  const TypeSpec ts = parse_type(opts.type);
  if (ts.mxfp4 && p->n_expert == 0)
    fail("MXFP4 is written for expert tensors only, and preset {} has no experts", p->name);
  if (opts.n_layer < 0 || opts.n_layer > p->n_layer)
    fail("--layers {} is outside [1, {}] for preset {}", opts.n_layer, p->n_layer, p->name);
  SynthPlan plan;
  plan.preset = p;
  plan.n_layer = opts.n_layer > 0 ? opts.n_layer : p->n_layer;
  plan.seed = opts.seed;
  hparam_meta(*p, ts, plan.n_layer, plan);
  tokenizer_meta(*p, plan);
  PlanBuilder b(*p, ts, plan.n_layer, plan);
  b.io_head();
  if (p->llama3_factor > 0)
    plan.tensors.push_back({"rope_freqs.weight", {p->n_rot / 2}, GgmlType::F32, SynthInit::kRopeFreqs, 0, 0});
  for (int64_t il = 0; il < plan.n_layer; ++il) layer_tensors(b, *p, il);
  b.io_tail();
  return plan;
}

std::vector<uint8_t> synth_tensor_bytes(const SynthPlan& plan, size_t index, int n_threads) {
  FRINK_ASSERT(index < plan.tensors.size());
  const SynthTensor& t = plan.tensors[index];
  std::vector<uint8_t> out(tensor_bytes(t));
  fill_tensor(plan, t, out.data(), resolve_threads(n_threads));
  return out;
}

void write_synth(const SynthPlan& plan, const std::string& path, int n_threads) {
  const int nt = resolve_threads(n_threads);
  GgufWriter w;
  for (const auto& [k, v] : plan.meta) w.set(k, v);
  for (const SynthTensor& t : plan.tensors)
    w.add_tensor(t.name, t.type, t.ne, [&plan, &t, nt](uint8_t* dst, size_t n_bytes) {
      FRINK_ASSERT(n_bytes == tensor_bytes(t));
      fill_tensor(plan, t, dst, nt);
    });
  w.write(path);
}

}  // namespace frink
