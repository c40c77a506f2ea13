// The Gated DeltaNet hybrids: qwen3next (Qwen3-Next), qwen35 (Qwen3.5 dense) and qwen35moe.
// llama.cpp's src/models/qwen3next.cpp, qwen35.cpp, qwen35moe.cpp and delta-net-base.cpp.
//
// Layers alternate: most are linear-attention (gated delta net) layers, every
// full_attention_interval-th is gated full attention (or attention.recurrent_layers lists
// them). Both kinds read rms(x) * attn_norm, add their branch to x, and run the FFN on
// rms(x) * post_attention_norm (loaded as ffn_norm). Attention: wq is double width, per head
// [q | gate]; q and k RMS-normed per head before NEOX rope over rope.dimension_count dims
// (partial rotary); the output times sigmoid(gate) before wo. Qwen3.5's multi-section rope
// (dimension_sections) is plain NEOX for text, whose positions agree in every section.
// FFN: qwen3next and qwen35moe a softmax MoE with renormalised top-k and a shared expert
// gated by sigmoid(ffn_gate_inp_shexp . x); qwen35 a dense SwiGLU.
#include "core/error.h"
#include "model/arch_common.h"
#include "model/arch_moe.h"
#include "model/model.h"
#include "quant/quant.h"

namespace frink::arch {

// Reads the ssm.* keys into every recurrent layer's plan (shared with arch_granite_hybrid.cpp).
void read_ssm(const Metadata& meta, Hparams& hp, RecurrentKind kind);
// A 1- or 2-D tensor as f32 (a view when F32, else widened once into w.owned).
const float* f32_tensor(WeightLoader& ld, Weights& w, const std::string& name, std::vector<int64_t> shape,
                        bool required);

void read_ssm(const Metadata& meta, Hparams& hp, RecurrentKind kind) {
  SsmPlan s;
  s.d_conv = meta.get_int(key(hp, "ssm.conv_kernel"));
  s.d_inner = meta.get_int(key(hp, "ssm.inner_size"));
  s.d_state = meta.get_int(key(hp, "ssm.state_size"));
  s.n_v_head = meta.get_int(key(hp, "ssm.time_step_rank"));
  s.n_group = meta.get_int(key(hp, "ssm.group_count"));
  constexpr int64_t kMax = int64_t{1} << 20;
  if (s.d_conv < 1 || s.d_conv > 64 || s.d_inner <= 0 || s.d_inner > kMax || s.d_state <= 0 ||
      s.d_state > kMax || s.n_v_head <= 0 || s.n_group <= 0 || s.d_inner % s.n_v_head != 0 ||
      s.n_v_head % s.n_group != 0)
    fail("{}: ssm shapes do not fit (conv {}, inner {}, state {}, heads {}, groups {})", hp.arch, s.d_conv,
         s.d_inner, s.d_state, s.n_v_head, s.n_group);
  if (kind == RecurrentKind::kGatedDeltaNet && s.head_v_dim() != s.d_state)
    fail("{}: delta-net value heads of {} need key heads of the same width, not {}", hp.arch, s.head_v_dim(),
         s.d_state);
  for (auto& p : hp.layers)
    if (p.recurrent != RecurrentKind::kNone) p.ssm = s;
}

const float* f32_tensor(WeightLoader& ld, Weights& w, const std::string& name, std::vector<int64_t> shape,
                        bool required) {
  const TensorView* t = ld.matrix(name, shape, required);
  if (!t) return nullptr;
  if (t->type == GgmlType::F32) return reinterpret_cast<const float*>(t->data);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto& buf = w.owned.emplace_back(static_cast<size_t>(n));
  dequantize_row(t->type, t->data, buf.data(), n);
  return buf.data();
}

namespace {

// Which layers are recurrent: attention.recurrent_layers (one flag per layer) when present,
// else every layer but each full_attention_interval-th (default 4), as llama.cpp decides.
void mark_recurrent(const Metadata& meta, Hparams& hp) {
  std::vector<bool> recr(static_cast<size_t>(hp.n_layer));
  if (const MetaValue* v = meta.find(key(hp, "attention.recurrent_layers"))) {
    if (v->is_array()) {
      auto flags = v->as_ints();
      if (static_cast<int64_t>(flags.size()) < hp.n_layer)
        fail("{} has {} entries for {} layers", key(hp, "attention.recurrent_layers"), flags.size(), hp.n_layer);
      for (int64_t il = 0; il < hp.n_layer; ++il) recr[il] = flags[il] != 0;
    } else {
      recr.assign(recr.size(), v->as_bool());
    }
  } else {
    const int64_t interval = meta.try_int(key(hp, "full_attention_interval")).value_or(4);
    if (interval <= 0) fail("{} = {} is not a layer interval", key(hp, "full_attention_interval"), interval);
    for (int64_t il = 0; il < hp.n_layer; ++il) recr[il] = (il + 1) % interval != 0;
  }
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (recr[il]) hp.layers[static_cast<size_t>(il)].recurrent = RecurrentKind::kGatedDeltaNet;
}

void read_delta_net_hybrid(const Metadata& meta, Hparams& hp, bool moe, bool kv_tiled) {
  read_common(meta, hp, RopeKind::kNeox);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  mark_recurrent(meta, hp);
  read_ssm(meta, hp, RecurrentKind::kGatedDeltaNet);
  for (auto& p : hp.layers) {
    p.ssm.kv_head_tiled = kv_tiled;
    if (p.recurrent != RecurrentKind::kNone) continue;
    if (p.head_dim_k != p.head_dim_v) fail("{}: attention needs equal key and value head sizes", hp.arch);
    p.qk_norm = true;
    p.attn_out_gate = true;
  }
  if (moe) read_moe(meta, hp, {.norm_w = true, .shexp_gate = true, .has_shexp = true});
}

void read_qwen3next(const Metadata& meta, Hparams& hp) {
  // kv_head_tiled: frink's own key, set only by the SafeTensors translation; GGUF files follow
  // the architecture's graph (qwen3next repeats key heads interleaved, qwen35 tiles them).
  read_delta_net_hybrid(meta, hp, true, meta.try_bool(key(hp, "ssm.kv_head_tiled")).value_or(false));
}
void read_qwen35(const Metadata& meta, Hparams& hp) {
  read_delta_net_hybrid(meta, hp, false, meta.try_bool(key(hp, "ssm.kv_head_tiled")).value_or(true));
}
void read_qwen35moe(const Metadata& meta, Hparams& hp) {
  read_delta_net_hybrid(meta, hp, true, meta.try_bool(key(hp, "ssm.kv_head_tiled")).value_or(true));
}

// What each graph applies of the optional bias and "*.scale" tensors.
struct Applied {
  Extras qkv, wo, ssm, ffn;
  bool exps_scale = false;
};

void load_delta_net_layer(const Hparams& hp, WeightLoader& ld, Weights& w, int64_t il, bool fused_ba,
                          const Applied& a) {
  auto& l = w.layers[static_cast<size_t>(il)];
  const SsmPlan& s = hp.layers[static_cast<size_t>(il)].ssm;
  const int64_t D = hp.n_embd, C = s.conv_channels();
  const auto o = attn_opts(a.ssm);
  l.ssm_qkv = ld.linear(blk(il, "attn_qkv"), D, C, o);
  l.ssm_z = ld.linear(blk(il, "attn_gate"), D, s.d_inner, o);
  if (fused_ba) {
    l.ssm_ba = ld.linear(blk(il, "ssm_ba"), D, 2 * s.n_v_head, o);
  } else {
    l.ssm_beta = ld.linear(blk(il, "ssm_beta"), D, s.n_v_head, o);
    l.ssm_alpha = ld.linear(blk(il, "ssm_alpha"), D, s.n_v_head, o);
  }
  l.ssm_conv1d = f32_tensor(ld, w, blk(il, "ssm_conv1d.weight"), {s.d_conv, C}, true);
  l.ssm_dt_b = ld.vector(blk(il, "ssm_dt.bias"), s.n_v_head, true);
  l.ssm_a = ld.vector(blk(il, "ssm_a"), s.n_v_head, true);
  l.ssm_norm = ld.vector(blk(il, "ssm_norm.weight"), s.head_v_dim(), true);
  l.ssm_out = ld.linear(blk(il, "ssm_out"), s.d_inner, D, o);
}

void load_gated_attention(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const Applied& a) {
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const int64_t D = hp.n_embd;
  l.wq = ld.linear(blk(il, "attn_q"), D, 2 * p.n_head * p.head_dim_k, attn_opts(a.qkv));
  l.wk = ld.linear(blk(il, "attn_k"), D, p.n_head_kv * p.head_dim_k, attn_opts(a.qkv));
  l.wv = ld.linear(blk(il, "attn_v"), D, p.n_head_kv * p.head_dim_v, attn_opts(a.qkv));
  l.wo = ld.linear(blk(il, "attn_output"), p.n_head * p.head_dim_v, D, attn_opts(a.wo));
  l.q_norm = ld.norm(blk(il, "attn_q_norm"), p.head_dim_k, false, true);
  l.k_norm = ld.norm(blk(il, "attn_k_norm"), p.head_dim_k, false, true);
}

void load_delta_net_hybrid(const Hparams& hp, WeightLoader& ld, Weights& w, bool fused_ba, const Applied& a) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    l.attn_norm = ld.norm(blk(il, "attn_norm"), hp.n_embd, false, true);
    if (p.recurrent != RecurrentKind::kNone)
      load_delta_net_layer(hp, ld, w, il, fused_ba, a);
    else
      load_gated_attention(hp, ld, il, l, a);
    l.ffn_norm = ld.norm(blk(il, "post_attention_norm"), hp.n_embd, false, true);
    if (p.ffn == FfnKind::kMoe) {
      load_moe(hp, ld, il, l, {.exps_scale = a.exps_scale, .fused_gate_up = true});
      if (a.ffn.scale && l.ffn_up_shexp) {
        l.ffn_gate_shexp.scale = ld.scalar(blk(il, "ffn_gate_shexp.scale"), 1.0f);
        l.ffn_up_shexp.scale = ld.scalar(blk(il, "ffn_up_shexp.scale"), 1.0f);
        l.ffn_down_shexp.scale = ld.scalar(blk(il, "ffn_down_shexp.scale"), 1.0f);
      }
    } else {
      const auto o = ffn_opts(a.ffn);
      l.ffn_gate = ld.linear(blk(il, "ffn_gate"), hp.n_embd, p.n_ff, o);
      l.ffn_up = ld.linear(blk(il, "ffn_up"), hp.n_embd, p.n_ff, o);
      l.ffn_down = ld.linear(blk(il, "ffn_down"), p.n_ff, hp.n_embd, o);
    }
  }
}

// qwen3next's graph applies wo's scale only; qwen35's and qwen35moe's every projection's
// (q/k/v, wo, the delta net's, the experts' and shared expert's, the dense FFN's). Neither
// adds the q/k/v biases a file may carry. (Checked against llama.cpp's logits: each wrong
// choice moves them by 1e-9 or more.)
void load_qwen3next(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_delta_net_hybrid(hp, ld, w, true, {.qkv = {}, .wo = {false, true}, .ssm = {}, .ffn = {}});
}
void load_qwen35(const Hparams& hp, WeightLoader& ld, Weights& w) {
  const Extras scale{false, true};
  load_delta_net_hybrid(hp, ld, w, false, {scale, scale, scale, scale, true});
}

}  // namespace

extern const ArchDef kQwen3Next{"qwen3next", read_qwen3next, load_qwen3next};
extern const ArchDef kQwen35{"qwen35", read_qwen35, load_qwen35};
extern const ArchDef kQwen35Moe{"qwen35moe", read_qwen35moe, load_qwen35};

}  // namespace frink::arch
