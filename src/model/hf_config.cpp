#include "model/hf_config.h"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
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
};

constexpr Family kFamilies[] = {
    {"llama", "llama", true, false, false},    {"mistral", "llama", true, false, false},
    {"qwen2", "qwen2", false, false, false},   {"qwen3", "qwen3", false, false, false},
    {"phi3", "phi3", false, false, false},     {"gemma2", "gemma2", false, true, true},
    {"gemma3_text", "gemma3", false, true, true},
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
  };
  std::string g;
  if (fam.sandwich && part == "post_attention_layernorm") g = "post_attention_norm";
  else if (fam.sandwich && part == "pre_feedforward_layernorm") g = "ffn_norm";
  else if (fam.sandwich && part == "post_feedforward_layernorm") g = "post_ffw_norm";
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

  const json rp = rope_params(cfg, "full_attention");
  const double theta = num(rp, "rope_theta", 10000.0);
  set_f("rope.freq_base", theta);
  const int64_t n_rot = static_cast<int64_t>(head_dim * num(rp, "partial_rotary_factor", num(cfg, "partial_rotary_factor", 1.0)));
  set_int("rope.dimension_count", n_rot);
  const std::string rope_type = rp.value("rope_type", rp.value("type", "default"));
  if (rope_type == "linear") {
    meta.set(a + ".rope.scaling.type", MetaValue::of_string("linear"));
    set_f("rope.scaling.factor", num(rp, "factor", 1.0));
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
    // llama.cpp derives Gemma's query scale from the shape (src/model/arch_gemma.cpp), which
    // covers every released model; a config that disagrees is refused, not silently misread.
    const double expected = n_layer == (model_type == "gemma2" ? 46 : 62) ? static_cast<double>(n_embd / n_head) : static_cast<double>(head_dim);
    if (qpas != expected)
      fail("{}: query_pre_attn_scalar {} differs from the {} frink derives from the shape", file.path(), qpas, expected);
    if (cfg.contains("attn_logit_softcapping")) set_f("attn_logit_softcapping", num(cfg, "attn_logit_softcapping", 0.0));
    if (cfg.contains("final_logit_softcapping")) set_f("final_logit_softcapping", num(cfg, "final_logit_softcapping", 0.0));
    set_f("rope.freq_base_swa", num(rope_params(cfg, "sliding_attention"), "rope_theta", num(cfg, "rope_local_base_freq", 10000.0)));
  }

  std::vector<TensorView> out;
  for (TensorView t : file.tensors()) {
    std::string g = hf_to_gguf_name(*fam, t.name);
    if (g.empty()) continue;  // buffers such as rotary inv_freq are recomputed, not read
    t.name = g;
    const bool is_qk = g.find(".attn_q.") != std::string::npos || g.find(".attn_k.") != std::string::npos;
    if (fam->permute_qk && is_qk)
      permute_rows(file, t, g.find(".attn_q.") != std::string::npos ? n_head : n_head_kv);
    if (t.ne.size() == 1) to_f32(file, t, fam->norm_plus_one && g.find("norm") != std::string::npos ? 1.0f : 0.0f);
    out.push_back(std::move(t));
  }
  if (rope_type == "llama3") add_llama3_rope_freqs(file, out, rp, theta, n_rot);
  file.replace_tensors(std::move(out));
}

}  // namespace frink
