// phi3: NEOX rotary embeddings, q/k/v either fused (attn_qkv) or separate, and gate|up
// stacked in one 2*n_ff-wide ffn_up.
#include "model/arch_common.h"
#include "model/model.h"

namespace frink::arch {

namespace {

void read_phi3(const Metadata& meta, Hparams& hp) {
  read_common(meta, hp, RopeKind::kNeox);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  for (auto& p : hp.layers) p.ffn = FfnKind::kGatedFused;
}

void load_phi3(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    const int64_t q = p.n_head * p.head_dim_k, kv = p.n_head_kv * p.head_dim_k;
    l.attn_norm = ld.norm(blk(il, "attn_norm"), hp.n_embd, false, true);
    // phi3's graph applies q/k/v and output biases and scales, none on the FFN.
    const LayerExtras x{{true, true}, {true, true}, {false, false}};
    auto fused = attn_opts(x.qkv);
    fused.required = false;
    l.wqkv = ld.linear(blk(il, "attn_qkv"), hp.n_embd, q + 2 * kv, fused);
    if (!l.wqkv) {
      l.wq = ld.linear(blk(il, "attn_q"), hp.n_embd, q, attn_opts(x.qkv));
      l.wk = ld.linear(blk(il, "attn_k"), hp.n_embd, kv, attn_opts(x.qkv));
      l.wv = ld.linear(blk(il, "attn_v"), hp.n_embd, kv, attn_opts(x.qkv));
    }
    l.wo = ld.linear(blk(il, "attn_output"), q, hp.n_embd, attn_opts(x.wo));
    load_ffn(hp, ld, il, l, x);
  }
}

}  // namespace

extern const ArchDef kPhi3{"phi3", read_phi3, load_phi3};

}  // namespace frink::arch
