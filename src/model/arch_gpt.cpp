// The GPT-style families: LayerNorm with bias, plain (ungated) GELU FFN with biases.
// bloom: fused qkv, ALiBi instead of rotary embeddings, a LayerNorm on the embeddings.
// starcoder2: separate q/k/v with biases, NEOX rotary embeddings.
// falcon: fused qkv (multi-query), NEOX rotary, parallel attention + FFN from one norm
// (falcon-7b) or two (falcon-40b: attn_norm_2), no biases.
#include "model/arch_common.h"
#include "model/model.h"

namespace frink::arch {

namespace {

void read_gpt(const Metadata& meta, Hparams& hp, RopeKind rope) {
  read_common(meta, hp, rope);
  hp.norm = NormKind::kLayer;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_epsilon")));
  for (auto& p : hp.layers) {
    p.ffn = FfnKind::kPlain;
    p.act = Activation::kGeluTanh;
  }
}

void read_bloom(const Metadata& meta, Hparams& hp) {
  read_gpt(meta, hp, RopeKind::kNone);
  hp.embd_norm = true;
  hp.max_alibi_bias = 8.0f;  // llama.cpp hard-codes bloom's bias; the file's key is not read
  for (auto& p : hp.layers) p.alibi = true;
}

void read_starcoder2(const Metadata& meta, Hparams& hp) { read_gpt(meta, hp, RopeKind::kNeox); }

void read_falcon(const Metadata& meta, Hparams& hp) {
  read_gpt(meta, hp, RopeKind::kNeox);
  for (auto& p : hp.layers) p.parallel_residual = true;
}

void load_fused_qkv(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const LayerExtras& x) {
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const int64_t q = p.n_head * p.head_dim_k, kv = p.n_head_kv * p.head_dim_k;
  l.attn_norm = ld.norm(blk(il, "attn_norm"), hp.n_embd, true, true);
  l.wqkv = ld.linear(blk(il, "attn_qkv"), hp.n_embd, q + 2 * kv, attn_opts(x.qkv));
  l.wo = ld.linear(blk(il, "attn_output"), q, hp.n_embd, attn_opts(x.wo));
}

// bloom and starcoder2 apply every bias, and the attention scales but not the FFN ones.
constexpr LayerExtras kGptExtras{{true, true}, {true, true}, {true, false}};

void load_bloom(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  w.embd_norm = ld.norm("token_embd_norm", hp.n_embd, true, true);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    load_fused_qkv(hp, ld, il, l, kGptExtras);
    load_ffn(hp, ld, il, l, kGptExtras);
  }
}

void load_starcoder2(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    load_attention(hp, ld, il, l, kGptExtras);
    load_ffn(hp, ld, il, l, kGptExtras);
  }
}

void load_falcon(const Hparams& hp, WeightLoader& ld, Weights& w) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    const LayerExtras x{{false, true}, {false, true}, {false, false}};
    load_fused_qkv(hp, ld, il, l, x);
    // falcon-40b normalises the FFN input separately (attn_norm_2); 7b shares attn_norm.
    l.ffn_norm = ld.norm(blk(il, "attn_norm_2"), hp.n_embd, true, false);
    l.ffn_up = ld.linear(blk(il, "ffn_up"), hp.n_embd, p.n_ff, ffn_opts(x.ffn));
    l.ffn_down = ld.linear(blk(il, "ffn_down"), p.n_ff, hp.n_embd, ffn_opts(x.ffn));
  }
}

}  // namespace

extern const ArchDef kBloom{"bloom", read_bloom, load_bloom};
extern const ArchDef kStarcoder2{"starcoder2", read_starcoder2, load_starcoder2};
extern const ArchDef kFalcon{"falcon", read_falcon, load_falcon};

}  // namespace frink::arch
