#include "model/hf_config.h"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/arch_gemma.h"
#include "model/hf_delta_net.h"
#include "quant/quant.h"

namespace frink {

namespace {

using nlohmann::json;

// What differs between the Hugging Face families frink reads, in the terms of llama.cpp's
// converter (convert_hf_to_gguf.py), so a SafeTensors folder and the GGUF converted from it
// load into identical weights.
struct Family {
  const char* model_type;  // config.json "model_type"
  const char* arch;        // GGUF general.architecture
  bool permute_qk;         // HF rotates halves; llama.cpp's llama rotates adjacent pairs, so
                           // the converter permutes q/k rows (LlamaModel.permute)
  bool norm_plus_one;      // Gemma's RMSNorm multiplies by (1 + w); GGUF stores 1 + w
  bool sandwich;           // Gemma's four norms per layer
  // How a mixture of experts is stored: none, one tensor per expert and projection (Mixtral,
  // Qwen3-MoE: stacked into GGUF's 3-D tensors), or gpt-oss's fused, transposed experts.
  enum class Experts { kNone, kPerExpert, kGptOss } experts = Experts::kNone;
};

constexpr Family kFamilies[] = {
    {"llama", "llama", true, false, false},    {"mistral", "llama", true, false, false},
    {"qwen2", "qwen2", false, false, false},   {"qwen3", "qwen3", false, false, false},
    {"phi3", "phi3", false, false, false},     {"gemma2", "gemma2", false, true, true},
    {"gemma3_text", "gemma3", false, true, true},
    {"mixtral", "llama", true, false, false, Family::Experts::kPerExpert},
    {"qwen3_moe", "qwen3moe", false, false, false, Family::Experts::kPerExpert},
    {"gpt_oss", "gpt-oss", false, false, false, Family::Experts::kGptOss},
    // Gated DeltaNet hybrids (hf_delta_net.cpp): (1 + w) norms like Gemma's.
    {"qwen3_next", "qwen3next", false, true, false, Family::Experts::kPerExpert},
    {"qwen3_5_text", "qwen35", false, true, false},
};

double num(const json& j, const char* k, double fallback) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

int64_t req_int(const json& j, const char* k) {
  auto it = j.find(k);
  if (it == j.end() || !it->is_number_integer()) fail("config.json: '{}' is missing or not an integer", k);
  return it->get<int64_t>();
}

// transformers 5 keeps rope settings in rope_parameters (per layer type for some models);
// 4.x used rope_theta + rope_scaling. Returns the dict for `layer_type` when split by type.
json rope_params(const json& cfg, const char* layer_type) {
  json rp = cfg.value("rope_parameters", json::object());
  if (rp.is_object() && rp.contains(layer_type) && rp[layer_type].is_object()) rp = rp[layer_type];
  if (!rp.is_object() || rp.empty()) {
    rp = cfg.value("rope_scaling", json::object());
    if (!rp.is_object()) rp = json::object();
    if (cfg.contains("rope_theta")) rp["rope_theta"] = cfg["rope_theta"];
  }
  return rp;
}

std::string hf_to_gguf_name(const Family& fam, const std::string& hf) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  if (auto it = kTop.find(hf); it != kTop.end()) return it->second;
  static const std::regex kLayer(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(hf, m, kLayer)) return "";
  const std::string part = m[2];
  static const std::map<std::string, std::string> kCommon = {
      {"input_layernorm", "attn_norm"},     {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},       {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},  {"self_attn.qkv_proj", "attn_qkv"},
      {"self_attn.q_norm", "attn_q_norm"},  {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},        {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},        {"mlp.gate_up_proj", "ffn_up"},
      {"mlp.gate", "ffn_gate_inp"},         {"block_sparse_moe.gate", "ffn_gate_inp"},
      {"mlp.router", "ffn_gate_inp"},
  };
  std::string g;
  if (fam.sandwich && part == "post_attention_layernorm") g = "post_attention_norm";
  else if (fam.sandwich && part == "pre_feedforward_layernorm") g = "ffn_norm";
  else if (fam.sandwich && part == "post_feedforward_layernorm") g = "post_ffw_norm";
  else if (fam.experts == Family::Experts::kGptOss && part == "post_attention_layernorm") g = "post_attention_norm";
  else if (part == "post_attention_layernorm") g = "ffn_norm";
  else if (auto it = kCommon.find(part); it != kCommon.end()) g = it->second;
  else return "";
  return "blk." + std::string(m[1]) + "." + g + "." + std::string(m[3]);
}

// Rows of q/k reordered from HF's halves to llama.cpp's interleaved pairs, per head.
void permute_rows(ModelFile& file, TensorView& t, int64_t n_head) {
  // A weight's rows are its output features; a bias has one element per feature.
  const int64_t rows = t.ne.size() == 1 ? t.ne[0] : t.n_rows(), hd = rows / n_head;
  const size_t rb = t.n_bytes / static_cast<size_t>(rows);
  auto& out = file.own_bytes(t.n_bytes);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t dst = h * hd + 2 * i + j, src = h * hd + j * (hd / 2) + i;
        std::memcpy(out.data() + dst * rb, t.data + src * rb, rb);
      }
  t.data = out.data();
}

// A 1-D tensor widened to f32, optionally with 1 added (Gemma norms).
void to_f32(ModelFile& file, TensorView& t, float add) {
  const int64_t n = t.n_elements();
  auto& out = file.own_bytes(static_cast<size_t>(n) * sizeof(float));
  float* f = reinterpret_cast<float*>(out.data());
  dequantize_row(t.type, t.data, f, n);
  for (int64_t i = 0; i < n; ++i) f[i] += add;
  t.type = GgmlType::F32;
  t.data = out.data();
  t.n_bytes = out.size();
}

// An f32 tensor owned by the file, holding `v`.
TensorView owned_f32(ModelFile& file, std::string name, std::vector<int64_t> ne, const std::vector<float>& v) {
  auto& buf = file.own_bytes(v.size() * sizeof(float));
  std::memcpy(buf.data(), v.data(), buf.size());
  return TensorView{std::move(name), GgmlType::F32, std::move(ne), buf.data(), buf.size()};
}

std::vector<float> widen(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.type, t.data, v.data(), t.n_elements());
  return v;
}

// Mixtral / Qwen3-MoE keep one [n_out, n_in] matrix per expert and projection
// (model.layers.L.<mlp|block_sparse_moe>.experts.E.<proj>.weight); GGUF stacks them in
// expert order into one {n_in, n_out, n_expert} tensor (convert_hf_to_gguf.py's torch.stack).
// Collects `t` into its stack and returns true when it is such a tensor.
using ExpertStacks = std::map<std::string, std::vector<std::optional<TensorView>>>;
bool collect_expert(const TensorView& t, int64_t n_expert, ExpertStacks& stacks) {
  static const std::regex kExpert(R"(model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight)");
  static const std::map<std::string, std::string> kProj = {
      {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}, {"down_proj", "ffn_down_exps"},
      {"w1", "ffn_gate_exps"},        {"w3", "ffn_up_exps"},      {"w2", "ffn_down_exps"},
  };
  std::smatch m;
  if (!std::regex_match(t.name, m, kExpert)) return false;
  auto proj = kProj.find(m[3]);
  const int64_t e = std::stoll(m[2]);
  if (proj == kProj.end() || e >= n_expert) fail("expert tensor '{}' does not fit {} experts", t.name, n_expert);
  auto& stack = stacks["blk." + std::string(m[1]) + "." + proj->second + ".weight"];
  stack.resize(static_cast<size_t>(n_expert));
  stack[static_cast<size_t>(e)] = t;
  return true;
}

void stack_experts(ModelFile& file, ExpertStacks& stacks, std::vector<TensorView>& out) {
  for (auto& [name, parts] : stacks) {
    const TensorView* first = parts[0] ? &*parts[0] : nullptr;
    size_t n_bytes = 0;
    for (size_t e = 0; e < parts.size(); ++e) {
      if (!parts[e] || !first || parts[e]->type != first->type || parts[e]->ne != first->ne || first->ne.size() != 2)
        fail("{}: expert {} of '{}' is missing or differs from expert 0", file.path(), e, name);
      n_bytes += parts[e]->n_bytes;
    }
    auto& buf = file.own_bytes(n_bytes);
    size_t off = 0;
    for (const auto& p : parts) {
      std::memcpy(buf.data() + off, p->data, p->n_bytes);
      off += p->n_bytes;
    }
    out.push_back(TensorView{name, first->type, {first->ne[0], first->ne[1], static_cast<int64_t>(parts.size())},
                             buf.data(), buf.size()});
  }
}

// gpt-oss keeps each layer's experts fused and transposed: gate_up_proj [E, n_embd, 2F] with
// gate and up interleaved along the last axis (gate = [..., ::2], up = [..., 1::2]) and
// down_proj [E, F, n_embd], used as x @ W. GGUF's layout is convert_hf_to_gguf.py's
// (GptOssModel): transpose(-1, -2), then split gate/up. Returns true when `t` was one of these
// (or the sinks), appending the GGUF tensors, widened to f32.
bool split_gpt_oss(ModelFile& file, const TensorView& t, std::vector<TensorView>& out) {
  static const std::regex kPart(R"(model\.layers\.(\d+)\.(mlp\.experts\.\w+|self_attn\.sinks))");
  std::smatch m;
  if (!std::regex_match(t.name, m, kPart)) return false;
  const std::string b = "blk." + std::string(m[1]) + ".", part = m[2];
  if (part.ends_with("_blocks") || part.ends_with("_scales"))
    fail("{}: '{}' is MXFP4 in transformers' packing, which frink does not read; convert it to GGUF", file.path(), t.name);
  const std::vector<float> v = widen(t);
  if (part == "self_attn.sinks") {
    out.push_back(owned_f32(file, b + "attn_sinks.weight", t.ne, v));
  } else if (part == "mlp.experts.gate_up_proj" && t.ne.size() == 3) {
    const int64_t F = t.ne[0] / 2, D = t.ne[1], E = t.ne[2];
    std::vector<float> gate(v.size() / 2), up(v.size() / 2);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t f = 0; f < F; ++f)
        for (int64_t d = 0; d < D; ++d) {
          const float* src = v.data() + (e * D + d) * 2 * F + 2 * f;
          gate[static_cast<size_t>((e * F + f) * D + d)] = src[0];
          up[static_cast<size_t>((e * F + f) * D + d)] = src[1];
        }
    out.push_back(owned_f32(file, b + "ffn_gate_exps.weight", {D, F, E}, gate));
    out.push_back(owned_f32(file, b + "ffn_up_exps.weight", {D, F, E}, up));
  } else if (part == "mlp.experts.gate_up_proj_bias" && t.ne.size() == 2) {
    const int64_t F = t.ne[0] / 2, E = t.ne[1];
    std::vector<float> gate(v.size() / 2), up(v.size() / 2);
    for (int64_t i = 0; i < E * F; ++i) {
      gate[static_cast<size_t>(i)] = v[static_cast<size_t>(2 * i)];
      up[static_cast<size_t>(i)] = v[static_cast<size_t>(2 * i + 1)];
    }
    out.push_back(owned_f32(file, b + "ffn_gate_exps.bias", {F, E}, gate));
    out.push_back(owned_f32(file, b + "ffn_up_exps.bias", {F, E}, up));
  } else if (part == "mlp.experts.down_proj" && t.ne.size() == 3) {
    const int64_t D = t.ne[0], F = t.ne[1], E = t.ne[2];
    std::vector<float> down(v.size());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t f = 0; f < F; ++f)
        for (int64_t d = 0; d < D; ++d)
          down[static_cast<size_t>((e * D + d) * F + f)] = v[static_cast<size_t>((e * F + f) * D + d)];
    out.push_back(owned_f32(file, b + "ffn_down_exps.weight", {F, D, E}, down));
  } else if (part == "mlp.experts.down_proj_bias") {
    out.push_back(owned_f32(file, b + "ffn_down_exps.bias", t.ne, v));
  } else {
    fail("{}: gpt-oss tensor '{}' has an unexpected name or shape", file.path(), t.name);
  }
  return true;
}

// Llama-3's frequency factors, as convert_hf_to_gguf computes rope_freqs.weight.
void add_llama3_rope_freqs(ModelFile& file, std::vector<TensorView>& out, const json& rp, double theta,
                           int64_t n_rot) {
  const double factor = num(rp, "factor", 8.0), lo = num(rp, "low_freq_factor", 1.0),
               hi = num(rp, "high_freq_factor", 4.0), old_ctx = num(rp, "original_max_position_embeddings", 8192);
  const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
  auto& buf = file.own_bytes(static_cast<size_t>(n_rot / 2) * sizeof(float));
  float* ff = reinterpret_cast<float*>(buf.data());
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(n_rot));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < hi_wavelen) ff[i] = 1.0f;
    else if (wavelen > lo_wavelen) ff[i] = static_cast<float>(factor);
    else {
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      ff[i] = static_cast<float>(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  out.push_back(TensorView{"rope_freqs.weight", GgmlType::F32, {n_rot / 2}, buf.data(), buf.size()});
}

}  // namespace

void translate_hf_model(ModelFile& file) {
  if (file.hf_config_json().empty()) fail("{}: no config.json beside the SafeTensors weights", file.path());
  json cfg;
  try {
    cfg = json::parse(file.hf_config_json());
  } catch (const json::exception& e) {
    fail("{}: broken JSON in config.json: {}", file.path(), e.what());
  }
  const std::string model_type = cfg.value("model_type", "");
  const Family* fam = nullptr;
  for (const auto& f : kFamilies)
    if (model_type == f.model_type) fam = &f;
  if (!fam) fail("{}: Hugging Face model_type '{}' is not supported", file.path(), model_type);

  const std::string a = fam->arch;
  Metadata& meta = file.mutable_metadata();
  auto set_int = [&](const std::string& k, int64_t v) { meta.set(a + "." + k, MetaValue::of_int(GgufType::UINT32, v)); };
  auto set_f = [&](const std::string& k, double v) { meta.set(a + "." + k, MetaValue::of_float(GgufType::FLOAT32, v)); };
  meta.set("general.architecture", MetaValue::of_string(a));
  const int64_t n_embd = req_int(cfg, "hidden_size"), n_head = req_int(cfg, "num_attention_heads");
  const int64_t n_head_kv = cfg.value("num_key_value_heads", n_head);
  const int64_t head_dim = cfg.contains("head_dim") && cfg["head_dim"].is_number_integer()
                               ? cfg["head_dim"].get<int64_t>() : n_embd / n_head;
  const int64_t n_layer = req_int(cfg, "num_hidden_layers");
  set_int("embedding_length", n_embd);
  set_int("block_count", n_layer);
  set_int("feed_forward_length", req_int(cfg, "intermediate_size"));
  set_int("context_length", cfg.value("max_position_embeddings", int64_t{2048}));
  set_int("attention.head_count", n_head);
  set_int("attention.head_count_kv", n_head_kv);
  set_int("attention.key_length", head_dim);
  set_int("attention.value_length", head_dim);
  set_int("vocab_size", req_int(cfg, "vocab_size"));
  set_f("attention.layer_norm_rms_epsilon", num(cfg, "rms_norm_eps", 1e-6));

  int64_t n_expert = 0;
  if (fam->experts != Family::Experts::kNone) {
    // transformers 5 spells the expert count num_local_experts for every MoE family here;
    // 4.x used num_experts for Qwen3-MoE.
    n_expert = cfg.contains("num_local_experts") ? req_int(cfg, "num_local_experts") : req_int(cfg, "num_experts");
    set_int("expert_count", n_expert);
    set_int("expert_used_count", req_int(cfg, "num_experts_per_tok"));
    if (cfg.contains("moe_intermediate_size")) set_int("expert_feed_forward_length", req_int(cfg, "moe_intermediate_size"));
    else if (fam->experts == Family::Experts::kGptOss) set_int("expert_feed_forward_length", req_int(cfg, "intermediate_size"));
    // llama.cpp's qwen3moe graph always renormalises and makes every layer sparse.
    if (model_type == "qwen3_moe") {
      const bool sparse_every = cfg.value("decoder_sparse_step", 1) == 1 &&
                                cfg.value("mlp_only_layers", json::array()).empty();
      if (!cfg.value("norm_topk_prob", true) || !sparse_every)
        fail("{}: Qwen3-MoE with norm_topk_prob false or dense layers (mlp_only_layers, decoder_sparse_step) "
             "is not supported", file.path());
    }
  }
  if (fam->experts == Family::Experts::kGptOss) {
    set_int("attention.sliding_window", req_int(cfg, "sliding_window"));
    if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
      MetaValue::Array pattern;
      for (const auto& t : cfg["layer_types"]) pattern.push_back(MetaValue::of_bool(t == "sliding_attention"));
      meta.set(a + ".attention.sliding_window_pattern", MetaValue::of_array(GgufType::BOOL, std::move(pattern)));
    }
  }

  const bool delta_net = a == "qwen3next" || a == "qwen35";
  if (delta_net) hf::set_delta_net_meta(cfg, meta, a);

  const json rp = rope_params(cfg, "full_attention");
  const double theta = num(rp, "rope_theta", 10000.0);
  set_f("rope.freq_base", theta);
  const int64_t n_rot = static_cast<int64_t>(head_dim * num(rp, "partial_rotary_factor", num(cfg, "partial_rotary_factor", 1.0)));
  set_int("rope.dimension_count", n_rot);
  const std::string rope_type = rp.value("rope_type", rp.value("type", "default"));
  if (rope_type == "linear") {
    meta.set(a + ".rope.scaling.type", MetaValue::of_string("linear"));
    set_f("rope.scaling.factor", num(rp, "factor", 1.0));
  } else if (rope_type == "yarn") {
    // transformers' _compute_yarn_parameters with its defaults is ggml's rope_yarn with
    // attn_factor 1; an explicit attention_factor or mscale would need more.
    if (rp.contains("attention_factor") || rp.contains("mscale") || rp.contains("mscale_all_dim"))
      fail("{}: YaRN with attention_factor or mscale is not supported for SafeTensors models", file.path());
    const double factor = num(rp, "factor", 1.0);
    const double orig = num(rp, "original_max_position_embeddings", static_cast<double>(cfg.value("max_position_embeddings", int64_t{2048})));
    // transformers recomputes the factor as max_position_embeddings / original when the
    // original length is given; a config where the two disagree is refused.
    if (rp.contains("original_max_position_embeddings") &&
        std::abs(static_cast<double>(cfg.value("max_position_embeddings", int64_t{0})) / orig - factor) > 1e-6)
      fail("{}: YaRN factor {} differs from max_position_embeddings / original_max_position_embeddings", file.path(), factor);
    meta.set(a + ".rope.scaling.type", MetaValue::of_string("yarn"));
    set_f("rope.scaling.factor", factor);
    set_int("rope.scaling.original_context_length", static_cast<int64_t>(orig));
    set_f("rope.scaling.yarn_beta_fast", num(rp, "beta_fast", 32.0));
    set_f("rope.scaling.yarn_beta_slow", num(rp, "beta_slow", 1.0));
    meta.set(a + ".rope.scaling.yarn_truncate", MetaValue::of_bool(rp.value("truncate", true)));
  } else if (rope_type != "default" && rope_type != "llama3") {
    fail("{}: rope type '{}' is not supported for SafeTensors models", file.path(), rope_type);
  }

  if (fam->sandwich) {
    // Which layers use the sliding window: HF's layer_types, else Gemma's fixed patterns.
    if (cfg.contains("sliding_window") && cfg["sliding_window"].is_number_integer())
      set_int("attention.sliding_window", cfg["sliding_window"].get<int64_t>());
    if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
      MetaValue::Array pattern;
      for (const auto& t : cfg["layer_types"]) pattern.push_back(MetaValue::of_bool(t == "sliding_attention"));
      meta.set(a + ".attention.sliding_window_pattern", MetaValue::of_array(GgufType::BOOL, std::move(pattern)));
    }
    const double qpas = num(cfg, "query_pre_attn_scalar", static_cast<double>(head_dim));
    // llama.cpp derives Gemma's query scale from the shape (arch::gemma_query_pre_attn_scalar);
    // a config that disagrees is refused, not silently misread.
    const double expected = static_cast<double>(arch::gemma_query_pre_attn_scalar(a, n_layer, n_embd, n_head, head_dim));
    if (qpas != expected)
      fail("{}: query_pre_attn_scalar {} differs from the {} frink derives from the shape", file.path(), qpas, expected);
    if (cfg.contains("attn_logit_softcapping")) set_f("attn_logit_softcapping", num(cfg, "attn_logit_softcapping", 0.0));
    if (cfg.contains("final_logit_softcapping")) set_f("final_logit_softcapping", num(cfg, "final_logit_softcapping", 0.0));
    set_f("rope.freq_base_swa", num(rope_params(cfg, "sliding_attention"), "rope_theta", num(cfg, "rope_local_base_freq", 10000.0)));
  }

  std::vector<TensorView> out;
  ExpertStacks stacks;
  for (TensorView t : file.tensors()) {
    if (delta_net && hf::translate_delta_net_tensor(file, cfg, t, out)) continue;
    if (fam->experts == Family::Experts::kPerExpert && collect_expert(t, n_expert, stacks)) continue;
    if (fam->experts == Family::Experts::kGptOss && split_gpt_oss(file, t, out)) continue;
    std::string g = hf_to_gguf_name(*fam, t.name);
    if (g.empty()) continue;  // buffers such as rotary inv_freq are recomputed, not read
    t.name = g;
    const bool is_qk = g.find(".attn_q.") != std::string::npos || g.find(".attn_k.") != std::string::npos;
    if (fam->permute_qk && is_qk)
      permute_rows(file, t, g.find(".attn_q.") != std::string::npos ? n_head : n_head_kv);
    if (t.ne.size() == 1) to_f32(file, t, fam->norm_plus_one && g.find("norm") != std::string::npos ? 1.0f : 0.0f);
    out.push_back(std::move(t));
  }
  stack_experts(file, stacks, out);
  if (rope_type == "llama3") add_llama3_rope_freqs(file, out, rp, theta, n_rot);
  file.replace_tensors(std::move(out));
}

}  // namespace frink
