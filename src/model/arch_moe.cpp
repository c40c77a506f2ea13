// Mixture-of-experts architectures on Llama's attention block: qwen2moe (shared expert with a
// sigmoid gate), qwen3moe (qwen3's per-head q/k norms, renormalised top-k weights) and olmoe
// (q/k RMSNorm over the whole projection). Also the expert readers every MoE family shares
// (arch_moe.h). Each graph's choices follow llama.cpp's src/models/<arch>.cpp.
#include "model/arch_moe.h"

#include "core/error.h"
#include "model/arch_common.h"
#include "model/model.h"

namespace frink::arch {

void read_moe(const Metadata& meta, Hparams& hp, const MoeSpec& spec) {
  const int64_t n_expert = meta.try_int(key(hp, "expert_count")).value_or(0);
  const int64_t n_used = meta.try_int(key(hp, "expert_used_count")).value_or(0);
  if (n_expert <= 0 || n_expert > 4096) fail("{} = {}: an MoE model needs experts", key(hp, "expert_count"), n_expert);
  if (n_used <= 0 || n_used > n_expert)
    fail("{} = {} does not fit {} experts", key(hp, "expert_used_count"), n_used, n_expert);
  std::optional<int64_t> ff_exp;
  if (spec.read_n_ff_exp) {
    ff_exp = meta.try_int(key(hp, "expert_feed_forward_length"));
    if (!ff_exp && spec.n_ff_exp_required) fail("missing metadata key {}", key(hp, "expert_feed_forward_length"));
    if (ff_exp && *ff_exp == 0) ff_exp.reset();
  }
  const auto ff_shexp = meta.try_int(key(hp, "expert_shared_feed_forward_length"));
  // llama.cpp: a scale of 0 (the key's default) means none.
  const float w_scale = static_cast<float>(meta.try_float(key(hp, "expert_weights_scale")).value_or(0.0));
  if (spec.n_leading_dense < 0 || spec.n_leading_dense > hp.n_layer)
    fail("{} dense leading layers for {} layers", spec.n_leading_dense, hp.n_layer);

  for (int64_t il = spec.n_leading_dense; il < hp.n_layer; ++il) {
    LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    MoePlan& m = p.moe;
    p.ffn = FfnKind::kMoe;
    m.n_expert = n_expert;
    m.n_expert_used = n_used;
    m.n_ff_exp = ff_exp ? *ff_exp : (spec.ff_div_used && spec.read_n_ff_exp ? p.n_ff / n_used : p.n_ff);
    if (m.n_ff_exp <= 0) fail("experts of layer {} have no width (feed_forward_length {})", il, p.n_ff);
    m.n_ff_shexp = spec.has_shexp ? (ff_shexp && *ff_shexp > 0 ? *ff_shexp : p.n_ff) : 0;
    m.gating = spec.gating;
    m.norm_w = spec.norm_w;
    m.w_scale = w_scale == 0.0f ? 1.0f : w_scale;
    m.swiglu_oai = spec.swiglu_oai;
    m.shexp_gate = spec.has_shexp && spec.shexp_gate;
  }
}

void load_moe(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const MoeTensors& t) {
  const MoePlan& m = hp.layers[static_cast<size_t>(il)].moe;
  const int64_t E = m.n_expert, F = m.n_ff_exp, D = hp.n_embd;
  l.ffn_gate_inp = ld.linear(blk(il, "ffn_gate_inp"), D, E, {t.router_bias, false, true, true});
  if (t.probs_bias) l.exp_probs_b = ld.vector(blk(il, "exp_probs_b.bias"), E, false);
  const WeightLoader::LinearOpts o{t.exps_bias, t.exps_scale, true, true};
  if (t.fused_gate_up)
    l.ffn_gate_up_exps = ld.experts(blk(il, "ffn_gate_up_exps"), D, 2 * F, E, {t.exps_bias, t.exps_scale, true, false});
  if (!l.ffn_gate_up_exps) {
    l.ffn_gate_exps = ld.experts(blk(il, "ffn_gate_exps"), D, F, E, o);
    l.ffn_up_exps = ld.experts(blk(il, "ffn_up_exps"), D, F, E, o);
  }
  l.ffn_down_exps = ld.experts(blk(il, "ffn_down_exps"), F, D, E, o);
  if (m.n_ff_shexp > 0) {
    const WeightLoader::LinearOpts s{false, false, true, true};
    l.ffn_gate_shexp = ld.linear(blk(il, "ffn_gate_shexp"), D, m.n_ff_shexp, s);
    l.ffn_up_shexp = ld.linear(blk(il, "ffn_up_shexp"), D, m.n_ff_shexp, s);
    l.ffn_down_shexp = ld.linear(blk(il, "ffn_down_shexp"), m.n_ff_shexp, D, s);
    // {n_embd}: a one-row matrix, so a 1-D tensor in the file (widened to f32 when 16-bit).
    if (m.shexp_gate) l.ffn_gate_inp_shexp = ld.vector(blk(il, "ffn_gate_inp_shexp.weight"), D, true);
  }
}

namespace {

void read_rms(const Metadata& meta, Hparams& hp, RopeKind rope) {
  read_common(meta, hp, rope);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
}

// qwen2moe: qwen2's attention (q/k/v biases), softmax routing without renormalisation, and a
// shared expert whose output is gated by sigmoid(ffn_gate_inp_shexp . x).
void read_qwen2moe(const Metadata& meta, Hparams& hp) {
  read_rms(meta, hp, RopeKind::kNeox);
  read_moe(meta, hp, {.norm_w = false, .shexp_gate = true, .has_shexp = true});
}

void load_qwen2moe(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    // build_qkv applies q/k/v biases and scales; wo with its bias and scale.
    load_attention(hp, ld, il, l, {{true, true}, {true, true}, {false, false}});
    l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, false, true);
    load_moe(hp, ld, il, l, {});
  }
}

// qwen3moe: qwen3's attention (per-head q/k RMSNorm before RoPE), softmax routing with the
// chosen weights renormalised, per-expert output scales applied.
void read_qwen3moe(const Metadata& meta, Hparams& hp) {
  read_rms(meta, hp, RopeKind::kNeox);
  for (auto& p : hp.layers) p.qk_norm = true;
  read_moe(meta, hp, {.norm_w = true});
}

void load_qwen3moe(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    load_attention(hp, ld, il, l, {{true, true}, {true, true}, {false, false}});
    l.q_norm = ld.norm(blk(il, "attn_q_norm"), p.head_dim_k, false, true);
    l.k_norm = ld.norm(blk(il, "attn_k_norm"), p.head_dim_k, false, true);
    l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, false, true);
    load_moe(hp, ld, il, l, {.exps_scale = true});
  }
}

// olmoe: q and k each RMS-normalised as one vector (not per head) before RoPE; softmax
// routing without renormalisation; experts as wide as feed_forward_length.
void read_olmoe(const Metadata& meta, Hparams& hp) {
  read_rms(meta, hp, RopeKind::kNeox);
  for (auto& p : hp.layers) p.qk_norm_full = true;
  read_moe(meta, hp, {.norm_w = false, .read_n_ff_exp = false});
}

void load_olmoe(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    // olmoe's graph projects q/k/v with no bias or scale, and applies wo's scale only.
    load_attention(hp, ld, il, l, {{false, false}, {false, true}, {false, false}});
    l.q_norm = ld.norm(blk(il, "attn_q_norm"), p.n_head * p.head_dim_k, false, true);
    l.k_norm = ld.norm(blk(il, "attn_k_norm"), p.n_head_kv * p.head_dim_k, false, true);
    l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, false, true);
    load_moe(hp, ld, il, l, {});
  }
}

}  // namespace

extern const ArchDef kQwen2Moe{"qwen2moe", read_qwen2moe, load_qwen2moe};
extern const ArchDef kQwen3Moe{"qwen3moe", read_qwen3moe, load_qwen3moe};
extern const ArchDef kOlmoe{"olmoe", read_olmoe, load_olmoe};

}  // namespace frink::arch
