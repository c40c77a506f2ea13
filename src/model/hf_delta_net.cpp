// SafeTensors Qwen3-Next (model_type qwen3_next) and Qwen3.5 text (qwen3_5_text) folders
// translated to GGUF's names and layouts, as llama.cpp's convert_hf_to_gguf.py does
// (Qwen3NextModel, Qwen3_5TextModel); hf_config.cpp calls in here for the parts only these
// Gated DeltaNet hybrids have.
//
// Layouts: Qwen3-Next's in_proj_qkvz groups rows by key head, [q (hk) | k (hk) | v (r hv) |
// z (r hv)] with r = value heads per key head; GGUF wants attn_qkv = all q | all k | all v
// and attn_gate = all z (value head index = key head * r + j in both). in_proj_ba is already
// per key head [b (r) | a (r)], ssm_ba's layout. Qwen3.5 splits them (in_proj_qkv, _z, _b, _a).
// A_log becomes ssm_a = -exp(A_log); conv1d [C, 1, K] is ssm_conv1d {K, C} as it lies.
// Every RMSNorm of these models multiplies by (1 + w) and GGUF stores 1 + w, except the
// gated norm of the linear attention (linear_attn.norm), which multiplies by w.
#include "model/hf_delta_net.h"

#include <cmath>
#include <cstring>
#include <regex>

#include "core/error.h"
#include "quant/quant.h"

namespace frink::hf {

namespace {

std::vector<float> widen(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.type, t.data, v.data(), t.n_elements());
  return v;
}

TensorView owned_f32(ModelFile& file, std::string name, std::vector<int64_t> ne, const std::vector<float>& v) {
  auto& buf = file.own_bytes(v.size() * sizeof(float));
  std::memcpy(buf.data(), v.data(), buf.size());
  return TensorView{std::move(name), GgmlType::F32, std::move(ne), buf.data(), buf.size()};
}

int64_t get(const nlohmann::json& cfg, const char* k) {
  auto it = cfg.find(k);
  if (it == cfg.end() || !it->is_number_integer()) fail("config.json: '{}' is missing or not an integer", k);
  return it->get<int64_t>();
}

}  // namespace

void set_delta_net_meta(const nlohmann::json& cfg, Metadata& meta, const std::string& a) {
  auto set_int = [&](const std::string& k, int64_t v) { meta.set(a + "." + k, MetaValue::of_int(GgufType::UINT32, v)); };
  const int64_t hk = get(cfg, "linear_key_head_dim"), hv = get(cfg, "linear_value_head_dim");
  if (hk != hv) fail("config.json: linear key heads of {} and value heads of {} differ", hk, hv);
  set_int("ssm.conv_kernel", get(cfg, "linear_conv_kernel_dim"));
  set_int("ssm.state_size", hk);
  set_int("ssm.group_count", get(cfg, "linear_num_key_heads"));
  set_int("ssm.time_step_rank", get(cfg, "linear_num_value_heads"));
  set_int("ssm.inner_size", hv * get(cfg, "linear_num_value_heads"));
  if (cfg.contains("shared_expert_intermediate_size"))
    set_int("expert_shared_feed_forward_length", get(cfg, "shared_expert_intermediate_size"));
  if (!cfg.contains("layer_types") || !cfg["layer_types"].is_array())
    fail("config.json: a Gated DeltaNet hybrid needs layer_types");
  MetaValue::Array recurrent;
  for (const auto& t : cfg["layer_types"]) recurrent.push_back(MetaValue::of_bool(t == "linear_attention"));
  meta.set(a + ".attention.recurrent_layers", MetaValue::of_array(GgufType::BOOL, std::move(recurrent)));
  // transformers repeats key heads with repeat_interleave (value head h reads key head
  // h / r); llama.cpp's qwen35 graph tiles them because its converter reorders value heads.
  meta.set(a + ".ssm.kv_head_tiled", MetaValue::of_bool(false));
}

bool translate_delta_net_tensor(ModelFile& file, const nlohmann::json& cfg, const TensorView& t,
                                std::vector<TensorView>& out) {
  static const std::regex kPart(R"(model\.layers\.(\d+)\.(linear_attn\.\w+|mlp\.shared_expert_gate|mlp\.shared_expert\.\w+|post_attention_layernorm)(\.weight)?)");
  std::smatch m;
  if (!std::regex_match(t.name, m, kPart)) return false;
  const std::string b = "blk." + std::string(m[1]) + ".", part = m[2];
  const std::vector<float> v = widen(t);
  const int64_t nk = get(cfg, "linear_num_key_heads"), nv = get(cfg, "linear_num_value_heads");
  const int64_t hk = get(cfg, "linear_key_head_dim"), r = nv / nk, D = t.ne.empty() ? 0 : t.ne[0];
  auto plus_one = [](std::vector<float> x) {
    for (auto& e : x) e += 1.0f;
    return x;
  };
  if (part == "post_attention_layernorm") {
    out.push_back(owned_f32(file, b + "post_attention_norm.weight", t.ne, plus_one(v)));
  } else if (part == "linear_attn.in_proj_qkvz") {
    const int64_t group = 2 * hk + 2 * r * hk;  // rows per key head
    const int64_t C = 2 * nk * hk + nv * hk, V = nv * hk;
    std::vector<float> qkv(static_cast<size_t>(C * D)), z(static_cast<size_t>(V * D));
    auto row = [&](int64_t kh, int64_t i) { return v.data() + (kh * group + i) * D; };
    for (int64_t kh = 0; kh < nk; ++kh) {
      for (int64_t i = 0; i < hk; ++i) {
        std::memcpy(&qkv[static_cast<size_t>((kh * hk + i) * D)], row(kh, i), D * sizeof(float));
        std::memcpy(&qkv[static_cast<size_t>((nk * hk + kh * hk + i) * D)], row(kh, hk + i), D * sizeof(float));
      }
      for (int64_t i = 0; i < r * hk; ++i) {
        std::memcpy(&qkv[static_cast<size_t>((2 * nk * hk + kh * r * hk + i) * D)], row(kh, 2 * hk + i), D * sizeof(float));
        std::memcpy(&z[static_cast<size_t>((kh * r * hk + i) * D)], row(kh, 2 * hk + r * hk + i), D * sizeof(float));
      }
    }
    out.push_back(owned_f32(file, b + "attn_qkv.weight", {D, C}, qkv));
    out.push_back(owned_f32(file, b + "attn_gate.weight", {D, V}, z));
  } else if (part == "linear_attn.in_proj_qkv") {
    out.push_back(owned_f32(file, b + "attn_qkv.weight", t.ne, v));
  } else if (part == "linear_attn.in_proj_z") {
    out.push_back(owned_f32(file, b + "attn_gate.weight", t.ne, v));
  } else if (part == "linear_attn.in_proj_ba") {
    out.push_back(owned_f32(file, b + "ssm_ba.weight", t.ne, v));
  } else if (part == "linear_attn.in_proj_b") {
    out.push_back(owned_f32(file, b + "ssm_beta.weight", t.ne, v));
  } else if (part == "linear_attn.in_proj_a") {
    out.push_back(owned_f32(file, b + "ssm_alpha.weight", t.ne, v));
  } else if (part == "linear_attn.conv1d") {
    // [C, 1, K] in torch order is ne {K, 1, C}: each channel's K taps, as ssm_conv1d {K, C}.
    out.push_back(owned_f32(file, b + "ssm_conv1d.weight", {t.ne[0], t.ne.back()}, v));
  } else if (part == "linear_attn.A_log") {
    std::vector<float> a(v.size());
    for (size_t i = 0; i < v.size(); ++i) a[i] = -std::exp(v[i]);
    out.push_back(owned_f32(file, b + "ssm_a", t.ne, a));
  } else if (part == "linear_attn.dt_bias") {
    out.push_back(owned_f32(file, b + "ssm_dt.bias", t.ne, v));
  } else if (part == "linear_attn.norm") {
    out.push_back(owned_f32(file, b + "ssm_norm.weight", t.ne, v));
  } else if (part == "linear_attn.out_proj") {
    out.push_back(owned_f32(file, b + "ssm_out.weight", t.ne, v));
  } else if (part == "mlp.shared_expert_gate") {
    out.push_back(owned_f32(file, b + "ffn_gate_inp_shexp.weight", {t.ne[0]}, v));
  } else if (part.starts_with("mlp.shared_expert.") && part.ends_with("_proj")) {
    const std::string proj = part.substr(std::strlen("mlp.shared_expert."));
    const std::string g = proj == "gate_proj" ? "ffn_gate_shexp" : proj == "up_proj" ? "ffn_up_shexp" : "ffn_down_shexp";
    out.push_back(owned_f32(file, b + g + ".weight", t.ne, v));
  } else {
    fail("{}: Gated DeltaNet tensor '{}' has an unexpected name", file.path(), t.name);
  }
  return true;
}

}  // namespace frink::hf
