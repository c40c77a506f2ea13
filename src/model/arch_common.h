// Readers shared by the architecture files: the keys most architectures define with the same
// meaning (llama.cpp's LLM_KV_* names), and the tensor groups most share.
#pragma once

#include <string>
#include <string_view>

#include "format/metadata.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace frink::arch {

// "<arch>.<suffix>"
std::string key(const Hparams& hp, std::string_view suffix);

// Reads vocab size, n_embd, n_layer, context length, head counts (scalar or per-layer
// arrays), key/value lengths, feed-forward length, and the rope basics (dimension_count,
// freq_base, linear/yarn scaling) into hp and hp.layers (resized to n_layer).
// rope kind and the norm kind/eps are set by the caller.
// allow_headless: a layer whose head_count is 0 gets n_head = n_head_kv = 0 (a recurrent
// layer of a hybrid whose file marks it that way, granitehybrid).
void read_common(const Metadata& meta, Hparams& hp, RopeKind rope, bool allow_headless = false);

// Which optional bias and "*.scale" tensors an architecture's graph applies, per group of
// projections. llama.cpp loads every one a file has but each architecture's graph passes
// only some of them on, and a tensor that is present but unused must stay unused.
struct Extras {
  bool bias = false;
  bool scale = false;
};
struct LayerExtras {
  Extras qkv;   // attn_q/k/v (or attn_qkv)
  Extras wo;    // attn_output
  Extras ffn;   // ffn_gate/up/down
};

// The usual per-layer attention tensors: attn_norm (with bias when the plan uses
// LayerNorm), separate q/k/v, attn_output.
void load_attention(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const LayerExtras& x);
// ffn_norm + gate/up/down (gated) or up/down (plain).
void load_ffn(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const LayerExtras& x);
WeightLoader::LinearOpts attn_opts(const Extras& e);
WeightLoader::LinearOpts ffn_opts(const Extras& e);
// token_embd, output_norm, output (tied to token_embd when absent).
void load_io(const Hparams& hp, WeightLoader& ld, Weights& w);

}  // namespace frink::arch
