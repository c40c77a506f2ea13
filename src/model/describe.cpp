#include "model/describe.h"

#include <fmt/format.h>

namespace frink {

namespace {
const char* rope_name(RopeKind k) {
  switch (k) {
    case RopeKind::kNone: return "none";
    case RopeKind::kNorm: return "pairs";
    case RopeKind::kNeox: return "neox";
  }
  return "?";
}
}  // namespace

std::string describe_layer(const LayerPlan& p) {
  std::string s = fmt::format("attention {}q/{}kv heads x {}", p.n_head, p.n_head_kv, p.head_dim_k);
  if (p.attn == AttnKind::kMla) s += fmt::format(", latent kv {} (+ rope {}) cached", p.mla.kv_lora_rank, p.rope.n_rot);
  s += p.window > 0 ? fmt::format(", window {}", p.window) : ", full";
  if (p.alibi) s += ", alibi";
  if (p.rope.kind != RopeKind::kNone)
    s += fmt::format(", rope {} {} base {:g}{}", rope_name(p.rope.kind), p.rope.n_rot, p.rope.freq_base,
                     p.rope.freq_scale != 1.0f ? fmt::format(" scale {:g}", p.rope.freq_scale) : "");
  if (p.qk_norm) s += ", qk-norm";
  if (p.attn_sinks) s += ", sinks";
  if (p.attn_softcap > 0) s += fmt::format(", softcap {:g}", p.attn_softcap);
  if (p.ffn == FfnKind::kMoe) {
    s += fmt::format("; moe {} of {} experts x {}", p.moe.n_expert_used, p.moe.n_expert, p.moe.n_ff_exp);
    if (p.moe.n_ff_shexp > 0) s += fmt::format(" + shared {}", p.moe.n_ff_shexp);
  } else {
    const char* ffn = p.ffn == FfnKind::kPlain ? "plain" : "gated";
    s += fmt::format("; ffn {} {} {}", ffn, p.act == Activation::kSilu ? "silu" : "gelu", p.n_ff);
  }
  if (p.post_attn_norm || p.post_ffn_norm) s += ", sandwich norms";
  if (p.parallel_residual) s += ", parallel residual";
  return s;
}

std::vector<std::string> describe_plan(const Hparams& hp) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 1; i <= hp.layers.size(); ++i) {
    const std::string cur = describe_layer(hp.layers[begin]);
    if (i < hp.layers.size() && describe_layer(hp.layers[i]) == cur) continue;
    out.push_back(i - 1 == begin ? fmt::format("layer {}: {}", begin, cur)
                                 : fmt::format("layers {}-{}: {}", begin, i - 1, cur));
    begin = i;
  }
  return out;
}

}  // namespace frink
