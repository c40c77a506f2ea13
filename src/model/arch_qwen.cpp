// qwen2 and qwen3: Llama's block with NEOX-style rotary embeddings; qwen2 adds q/k/v biases,
// qwen3 drops them and RMS-normalises each head of q and k before RoPE.
#include "model/arch_common.h"
#include "model/model.h"

namespace frink::arch {

namespace {

void read_qwen(const Metadata& meta, Hparams& hp, bool qk_norm) {
  read_common(meta, hp, RopeKind::kNeox);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  for (auto& p : hp.layers) p.qk_norm = qk_norm;
}

void read_qwen2(const Metadata& meta, Hparams& hp) { read_qwen(meta, hp, false); }
void read_qwen3(const Metadata& meta, Hparams& hp) { read_qwen(meta, hp, true); }

void load_qwen2(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  w.output.b = ld.vector("output.bias", hp.n_vocab, false);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    // qwen2's graph applies q/k/v and output biases and scales, not the FFN scales.
    const LayerExtras x{{true, true}, {true, true}, {false, false}};
    load_attention(hp, ld, il, l, x);
    load_ffn(hp, ld, il, l, x);
  }
}

void load_qwen3(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    // qwen3's graph applies q/k/v biases when a file has them, and every output scale.
    const LayerExtras x{{true, true}, {true, true}, {false, true}};
    load_attention(hp, ld, il, l, x);
    l.q_norm = ld.norm(blk(il, "attn_q_norm"), p.head_dim_k, false, true);
    l.k_norm = ld.norm(blk(il, "attn_k_norm"), p.head_dim_k, false, true);
    load_ffn(hp, ld, il, l, x);
  }
}

}  // namespace

extern const ArchDef kQwen2{"qwen2", read_qwen2, load_qwen2};
extern const ArchDef kQwen3{"qwen3", read_qwen3, load_qwen3};

}  // namespace frink::arch
