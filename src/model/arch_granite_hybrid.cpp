// granitehybrid (IBM Granite 4.0 hybrids): Mamba-2 layers mixed with attention layers, on
// Granite's scalars. llama.cpp's src/models/granite-hybrid.cpp and build_mamba2_layer
// (graph-context-mamba.cpp).
//
// A layer whose attention.head_count_kv is 0 is a Mamba-2 layer. Every layer reads
// rms(x) * attn_norm, then x += residual_scale * branch, then
// x += residual_scale * ffn(rms(x) * ffn_norm) (SwiGLU with biases). Attention: q/k/v with
// biases, llama-style (adjacent-pair) rope with rope_freqs as frequency divisors, only when
// rope.scaling.finetuned says the model uses rope; Q.K scaled by attention.scale (or
// 1/sqrt(head_dim) when 0). Inputs are multiplied by embedding_scale, logits divided by
// logit_scale (each only when non-zero).
//
// The scalars are folded into the weights at load: residual_scale into wo, ssm_out and
// ffn_down as an output scale applied after the bias (ggml_scale of the branch output), and
// 1/logit_scale into the output projection's scale, so the host bodies need no Granite case.
#include <cmath>

#include "core/error.h"
#include "model/arch_common.h"
#include "model/model.h"

namespace frink::arch {

void read_ssm(const Metadata& meta, Hparams& hp, RecurrentKind kind);
const float* f32_tensor(WeightLoader& ld, Weights& w, const std::string& name, std::vector<int64_t> shape,
                        bool required);

namespace {

void read_granite_hybrid(const Metadata& meta, Hparams& hp) {
  const bool finetuned = meta.try_bool(key(hp, "rope.scaling.finetuned")).value_or(false);
  read_common(meta, hp, finetuned ? RopeKind::kNorm : RopeKind::kNone, true);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  hp.embd_scale = static_cast<float>(meta.try_float(key(hp, "embedding_scale")).value_or(0.0));
  hp.residual_scale = static_cast<float>(meta.try_float(key(hp, "residual_scale")).value_or(0.0));
  hp.logit_scale = static_cast<float>(meta.try_float(key(hp, "logit_scale")).value_or(0.0));
  const float attn_scale = static_cast<float>(meta.try_float(key(hp, "attention.scale")).value_or(0.0));
  for (auto& p : hp.layers) {
    if (p.n_head_kv == 0) {
      p.recurrent = RecurrentKind::kMamba2;
      continue;
    }
    if (attn_scale != 0.0f) p.attn_scale = attn_scale;
    p.rope.use_freq_factors = p.rope.kind != RopeKind::kNone;
  }
  read_ssm(meta, hp, RecurrentKind::kMamba2);
}

// Multiplies a branch's output projection by s after its bias: (W x + b) * s, which is
// ggml_scale applied to the branch output.
void fold_scale(Linear& l, float s, const std::string& what) {
  if (s == 0.0f) return;
  if (l.b && l.scale != 1.0f && !l.bias_before_scale)
    fail("{}: a residual scale on top of a projection scale and a bias", what);
  l.scale *= s;
  l.bias_before_scale = true;
}

void load_mamba2(const Hparams& hp, WeightLoader& ld, Weights& w, int64_t il) {
  auto& l = w.layers[static_cast<size_t>(il)];
  const SsmPlan& s = hp.layers[static_cast<size_t>(il)].ssm;
  const int64_t D = hp.n_embd, C = s.conv_channels(), H = s.n_v_head;
  const WeightLoader::LinearOpts o{false, true, false, true};  // ssm_in / ssm_out scales apply
  l.ssm_in = ld.linear(blk(il, "ssm_in"), D, s.d_inner + C + H, o);
  l.ssm_conv1d = f32_tensor(ld, w, blk(il, "ssm_conv1d.weight"), {s.d_conv, C}, true);
  l.ssm_conv1d_b = ld.vector(blk(il, "ssm_conv1d.bias"), C, true);
  l.ssm_dt_b = ld.vector(blk(il, "ssm_dt.bias"), H, true);
  l.ssm_a = f32_tensor(ld, w, blk(il, "ssm_a"), {1, H}, true);
  l.ssm_d = f32_tensor(ld, w, blk(il, "ssm_d"), {1, H}, true);
  l.ssm_norm = f32_tensor(ld, w, blk(il, "ssm_norm.weight"), {s.d_inner / s.n_group, s.n_group}, false);
  l.ssm_out = ld.linear(blk(il, "ssm_out"), s.d_inner, D, o);
}

void load_granite_hybrid(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  const float rs = hp.residual_scale;
  if (hp.logit_scale != 0.0f) w.output.scale = 1.0f / hp.logit_scale;
  bool rope_freqs = false;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    if (p.recurrent == RecurrentKind::kMamba2) {
      l.attn_norm = ld.norm(blk(il, "attn_norm"), hp.n_embd, false, true);
      load_mamba2(hp, ld, w, il);
      fold_scale(l.ssm_out, rs, blk(il, "ssm_out"));
    } else {
      // granite-hybrid's graph applies q/k/v and output biases and scales (the FFN's
      // biases only). Checked against llama.cpp's logits: each wrong choice costs >= 5e-12.
      load_attention(hp, ld, il, l, {{true, true}, {true, true}, {}});
      fold_scale(l.wo, rs, blk(il, "attn_output"));
      rope_freqs = rope_freqs || p.rope.use_freq_factors;
    }
    l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, false, true);
    load_ffn(hp, ld, il, l, {{}, {}, {true, false}});
    fold_scale(l.ffn_down, rs, blk(il, "ffn_down"));
  }
  if (rope_freqs) {
    int64_t n_rot = 0;
    for (const auto& p : hp.layers)
      if (p.recurrent == RecurrentKind::kNone) n_rot = p.rope.n_rot;
    w.rope_freqs = ld.vector("rope_freqs.weight", n_rot / 2, false);
  }
}

}  // namespace

extern const ArchDef kGraniteHybrid{"granitehybrid", read_granite_hybrid, load_granite_hybrid};

}  // namespace frink::arch
