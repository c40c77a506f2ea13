// llama (Llama 1/2/3, and Mistral-style files that say "llama") and mistral3: RMSNorm,
// rotary embeddings over adjacent pairs, SwiGLU. llama.cpp loads optional q/k/v/o and FFN
// biases and per-tensor output scales for these, and applies rope_freqs.weight (Llama-3's
// long-context frequency factors, computed by the converter) when present. With
// expert_count > 0 (Mixtral) every FFN is a mixture of experts as wide as feed_forward_length:
// softmax routing, renormalised top-k weights, per-expert output scales.
#include <cmath>

#include "model/arch_common.h"
#include "model/arch_moe.h"
#include "model/model.h"

namespace frink::arch {

namespace {

void read_llama(const Metadata& meta, Hparams& hp) {
  read_common(meta, hp, RopeKind::kNorm);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  // llama.cpp's llama graph does not read attention.scale: always 1/sqrt(head_dim).
  for (auto& p : hp.layers) p.rope.use_freq_factors = true;  // when the file has rope_freqs
  if (meta.try_int(key(hp, "expert_count")).value_or(0) > 0)
    read_moe(meta, hp, {.norm_w = true, .read_n_ff_exp = false});
}

void load_llama(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  const LayerPlan& p0 = hp.layers[0];
  w.rope_freqs = ld.vector("rope_freqs.weight", p0.rope.n_rot / 2, false);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    // llama's graph applies every optional bias and output scale it loads.
    const LayerExtras x{{true, true}, {true, true}, {true, true}};
    load_attention(hp, ld, il, w.layers[static_cast<size_t>(il)], x);
    auto& l = w.layers[static_cast<size_t>(il)];
    if (hp.layers[static_cast<size_t>(il)].ffn == FfnKind::kMoe) {
      l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, false, true);
      load_moe(hp, ld, il, l, {.exps_scale = true});
    } else {
      load_ffn(hp, ld, il, l, x);
    }
  }
}

void read_mistral3(const Metadata& meta, Hparams& hp) { read_llama(meta, hp); }

}  // namespace

extern const ArchDef kLlama{"llama", read_llama, load_llama};
extern const ArchDef kMistral3{"mistral3", read_mistral3, load_llama};

}  // namespace frink::arch
