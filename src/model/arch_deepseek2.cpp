// deepseek2 (DeepSeek-V2, V2.5, V3, R1 and the "lite" models; llama.cpp's LLM_ARCH_DEEPSEEK2,
// src/models/deepseek2.cpp): multi-head latent attention with its KV stored compressed
// (src/cpu/mla_attention.h), RMSNorm, rotary embeddings over adjacent pairs on the
// qk_rope_head_dim part only (YaRN in the released models, with DeepSeek's own attention
// scale), leading dense layers, then DeepSeek's mixture of experts: softmax (V2) or sigmoid
// (V3) routing per expert_gating_func, the exp_probs_b selection bias, optional
// group-limited top-k, expert_weights_norm / _scale, and one always-on shared expert.
//
// What the graph applies of the optional tensors llama.cpp's loader creates: attn_output's
// scale (build_attn gets wo_s), nothing else (build_ffn gets no FFN scales, build_moe_ffn no
// per-expert scales).
//
// Only the current layout is read: key_length_mla / value_length_mla with the split
// attn_k_b / attn_v_b, which llama.cpp runs with absorption. Older files with one attn_kv_b
// (llama.cpp's expanded, uncompressed-cache path) are refused with a message.
#include <cmath>

#include "core/error.h"
#include "model/arch_common.h"
#include "model/arch_moe.h"
#include "model/model.h"

namespace frink::arch {

namespace {

// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*: 0 (unset; DeepSeek-V2 files) and 1 are softmax,
// 2 sigmoid.
ExpertGating gating_of(const Metadata& meta, const Hparams& hp) {
  const int64_t g = meta.try_int(key(hp, "expert_gating_func")).value_or(0);
  if (g == 0 || g == 1) return ExpertGating::kSoftmax;
  if (g == 2) return ExpertGating::kSigmoid;
  fail("{} = {} is not a DeepSeek gating function", key(hp, "expert_gating_func"), g);
}

// The attention widths, checked against the keys llama.cpp derives them from.
void read_mla(const Metadata& meta, Hparams& hp) {
  const auto hd_k = meta.try_int(key(hp, "attention.key_length_mla"));
  const auto hd_v = meta.try_int(key(hp, "attention.value_length_mla"));
  if (!hd_k || !hd_v || *hd_k == 0 || *hd_v == 0)
    fail("{}: this DeepSeek-2 file predates multi-head latent attention keys (attention.key_length_mla); "
         "reconvert it with a current convert_hf_to_gguf.py", hp.name.empty() ? hp.arch : hp.name);
  const int64_t kv_lora = meta.get_int(key(hp, "attention.kv_lora_rank"));
  const int64_t q_lora = meta.try_int(key(hp, "attention.q_lora_rank")).value_or(0);
  for (LayerPlan& p : hp.layers) {
    const int64_t n_rot = p.rope.n_rot;
    // With absorption the cache row is [kv_lora | n_rot] and V its first kv_lora floats:
    // the file's key_length / value_length say exactly that.
    if (kv_lora <= 0 || p.head_dim_k != kv_lora + n_rot || p.head_dim_v != kv_lora)
      fail("{} = {}, {} = {} do not fit kv_lora_rank {} + rope {}", key(hp, "attention.key_length"), p.head_dim_k,
           key(hp, "attention.value_length"), p.head_dim_v, kv_lora, n_rot);
    if (*hd_k <= n_rot || *hd_v <= 0 || q_lora < 0)
      fail("{} = {} leaves no room beside rope {}", key(hp, "attention.key_length_mla"), *hd_k, n_rot);
    p.attn = AttnKind::kMla;
    p.mla.kv_lora_rank = kv_lora;
    p.mla.q_lora_rank = q_lora;
    p.head_dim_k = *hd_k;
    p.head_dim_v = *hd_v;
    p.n_head_kv = 1;
  }
}

// DeepSeek's YaRN (llama_context's yarn_attn_factor for LLM_ARCH_DEEPSEEK2, then the graph's
// "pre-scale kq_scale and attn_factor", TAG_DEEPSEEK2_YARN_LOG_MUL_FIX). The rope itself
// ends up with magnitude scale rope_attn_factor; Q.K is scaled by mscale^2 / sqrt(head_dim_k)
// with mscale = rope_attn_factor * (1 + 0.1 * log_mul * ln(factor)), log_mul being the
// converter's yarn_log_multiplier / 0.1 (llama.cpp undoes the converter's 0.1).
void read_rope_scale(const Metadata& meta, Hparams& hp) {
  const float log_mul = static_cast<float>(meta.try_float(key(hp, "rope.scaling.yarn_log_multiplier")).value_or(0.0)) / 0.1f;
  const float rope_attn_factor = static_cast<float>(meta.try_float(key(hp, "rope.scaling.attn_factor")).value_or(1.0));
  for (LayerPlan& p : hp.layers) {
    RopeParams& r = p.rope;
    const float factor = 1.0f / r.freq_scale;
    float attn_factor = static_cast<float>(meta.try_float(key(hp, "rope.scaling.yarn_attn_factor")).value_or(1.0));
    if (r.ext_factor != 0.0f) {
      // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dims) is 1 for DeepSeek-2
      // (mscale is set to mscale_all_dims); without a log multiplier it is get_mscale(factor, 1).
      const float m = log_mul != 0.0f || factor <= 1.0f ? 1.0f : 0.1f * std::log(factor) + 1.0f;
      // ... and the kernel's own (1 + 0.1 ln factor) is cancelled here.
      attn_factor = m / (1.0f + 0.1f * std::log(factor));
    }
    attn_factor *= rope_attn_factor;
    r.attn_factor = attn_factor;
    const float attn_factor_org = attn_factor * (1.0f + 0.1f * std::log(1.0f / r.freq_scale));
    const float mscale = attn_factor_org * (1.0f + 0.1f * log_mul * std::log(1.0f / r.freq_scale));
    p.attn_scale = mscale * mscale / std::sqrt(static_cast<float>(p.head_dim_k));
  }
}

void read_deepseek2(const Metadata& meta, Hparams& hp) {
  read_common(meta, hp, RopeKind::kNorm);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  read_mla(meta, hp);
  read_rope_scale(meta, hp);

  const int64_t n_dense = meta.try_int(key(hp, "leading_dense_block_count")).value_or(0);
  read_moe(meta, hp,
           {.gating = gating_of(meta, hp),
            .norm_w = meta.try_bool(key(hp, "expert_weights_norm")).value_or(false),
            .n_ff_exp_required = true,
            .has_shexp = true,
            .n_leading_dense = n_dense});
  const int64_t n_shared = meta.get_int(key(hp, "expert_shared_count"));
  const int64_t n_group = meta.try_int(key(hp, "expert_group_count")).value_or(0);
  const int64_t n_group_used = meta.try_int(key(hp, "expert_group_used_count")).value_or(0);
  for (int64_t il = n_dense; il < hp.n_layer; ++il) {
    MoePlan& m = hp.layers[static_cast<size_t>(il)].moe;
    // The shared experts are one FFN n_ff_exp * expert_shared_count wide (the
    // expert_shared_feed_forward_length key is not read).
    if (n_shared <= 0) fail("{} = {}: DeepSeek-2 has shared experts", key(hp, "expert_shared_count"), n_shared);
    m.n_ff_shexp = m.n_ff_exp * n_shared;
    if (n_group > 1) {
      if (m.n_expert % n_group != 0 || n_group_used <= 0 || n_group_used > n_group ||
          n_group_used * (m.n_expert / n_group) < m.n_expert_used)
        fail("{} experts in {} groups, {} used, cannot pick {}", m.n_expert, n_group, n_group_used, m.n_expert_used);
      m.n_group = n_group;
      m.n_group_used = n_group_used;
    }
  }
}

void load_deepseek2(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  const WeightLoader::LinearOpts plain{false, false, false, true};
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    LayerWeights& l = w.layers[static_cast<size_t>(il)];
    const int64_t E = hp.n_embd, H = p.n_head, R = p.mla.kv_lora_rank, Q = p.mla.q_lora_rank;
    const int64_t nope = p.head_dim_k - p.rope.n_rot;
    l.attn_norm = ld.norm(blk(il, "attn_norm"), E, false, true);
    if (Q > 0) {
      l.wq_a = ld.linear(blk(il, "attn_q_a"), E, Q, plain);
      l.q_a_norm = ld.norm(blk(il, "attn_q_a_norm"), Q, false, true);
      l.wq_b = ld.linear(blk(il, "attn_q_b"), Q, H * p.head_dim_k, plain);
    } else {
      l.wq = ld.linear(blk(il, "attn_q"), E, H * p.head_dim_k, plain);
    }
    l.wkv_a_mqa = ld.linear(blk(il, "attn_kv_a_mqa"), E, R + p.rope.n_rot, plain);
    l.kv_a_norm = ld.norm(blk(il, "attn_kv_a_norm"), R, false, true);
    l.wk_b = ld.experts(blk(il, "attn_k_b"), nope, R, H, plain);
    l.wv_b = ld.experts(blk(il, "attn_v_b"), R, p.head_dim_v, H, plain);
    l.wo = ld.linear(blk(il, "attn_output"), H * p.head_dim_v, E, {false, true, false, true});
    if (p.ffn == FfnKind::kMoe) {
      l.ffn_norm = ld.norm(blk(il, "ffn_norm"), E, false, true);
      load_moe(hp, ld, il, l, {.probs_bias = true, .fused_gate_up = true});
    } else {
      load_ffn(hp, ld, il, l, {});
    }
  }
}

}  // namespace

extern const ArchDef kDeepseek2{"deepseek2", read_deepseek2, load_deepseek2};

}  // namespace frink::arch
