// gpt-oss (GGUF architecture "gpt-oss", llama.cpp's LLM_ARCH_OPENAI_MOE, models/openai-moe-iswa.cpp):
// attention with q/k/v/o biases and a learned per-head sink logit in every softmax
// denominator; a sliding window on alternate layers (layer il windowed when il % period <
// period - 1, period 2 unless attention.sliding_window_pattern says otherwise); NEOX rotary
// embeddings (YaRN in the released models). The FFN input norm is stored as
// post_attention_norm. Every FFN is a mixture of experts: the router (with bias) picks the
// top-k raw logits and softmaxes over them; experts carry biases and use the clamped SwiGLU
// (alpha 1.702, limit 7).
#include <cmath>

#include "core/error.h"
#include "model/arch_common.h"
#include "model/arch_moe.h"
#include "model/model.h"

namespace frink::arch {

namespace {

// Which layers are windowed: sliding_window_pattern as a period (llama.cpp's
// set_swa_pattern) or, from a SafeTensors config's layer_types, one bool per layer.
void set_windows(const Metadata& meta, Hparams& hp, int64_t window) {
  const MetaValue* v = meta.find(key(hp, "attention.sliding_window_pattern"));
  if (v && v->is_array()) {
    if (static_cast<int64_t>(v->size()) != hp.n_layer)
      fail("{} has {} entries for {} layers", key(hp, "attention.sliding_window_pattern"), v->size(), hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (v->as_array()[static_cast<size_t>(il)].as_bool()) hp.layers[static_cast<size_t>(il)].window = window;
    return;
  }
  const int64_t period = v ? v->as_int() : 2;
  if (period <= 0) fail("{} = {} is not a layer period", key(hp, "attention.sliding_window_pattern"), period);
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (il % period < period - 1) hp.layers[static_cast<size_t>(il)].window = window;
}

void read_gpt_oss(const Metadata& meta, Hparams& hp) {
  read_common(meta, hp, RopeKind::kNeox);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  const int64_t window = meta.get_int(key(hp, "attention.sliding_window"));
  if (window <= 0) fail("{} = {}: gpt-oss needs a window", key(hp, "attention.sliding_window"), window);
  set_windows(meta, hp, window);
  const auto base_swa = meta.try_float(key(hp, "rope.freq_base_swa"));
  for (auto& p : hp.layers) {
    // The graph shapes heads by n_rot and scales Q.K by 1/sqrt(n_rot).
    if (p.rope.n_rot != p.head_dim_k || p.head_dim_k != p.head_dim_v)
      fail("gpt-oss needs rope.dimension_count ({}) equal to the head size ({})", p.rope.n_rot, p.head_dim_k);
    p.attn_scale = 1.0f / std::sqrt(static_cast<float>(p.rope.n_rot));
    p.attn_sinks = true;
    if (p.window > 0 && base_swa) p.rope.freq_base = static_cast<float>(*base_swa);
  }
  read_moe(meta, hp, {.gating = ExpertGating::kSoftmaxWeight, .swiglu_oai = true, .n_ff_exp_required = true});
}

void load_gpt_oss(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    // build_qkv applies q/k/v biases and scales; wo with its bias and scale.
    load_attention(hp, ld, il, l, {{true, true}, {true, true}, {false, false}});
    l.attn_sinks = ld.vector(blk(il, "attn_sinks.weight"), p.n_head, true);
    l.ffn_norm = ld.norm(blk(il, "post_attention_norm"), hp.n_embd, false, true);
    load_moe(hp, ld, il, l, {.exps_bias = true, .router_bias = true});
  }
}

}  // namespace

extern const ArchDef kGptOss{"gpt-oss", read_gpt_oss, load_gpt_oss};

}  // namespace frink::arch
