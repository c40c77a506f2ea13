// gemma2 and gemma3: embeddings scaled by sqrt(n_embd), sandwich norms around attention and
// FFN, GELU(tanh)-gated FFN, NEOX rotary embeddings, and sliding-window attention on a
// fixed layer pattern. gemma2 adds attention and final logit softcaps; gemma3 adds per-head
// q/k RMSNorm and a separate rope base for its local (windowed) layers.
// Norm weights in GGUF already hold (1 + w): llama.cpp's converter adds the one.
#include <cmath>

#include "core/error.h"
#include "model/arch_common.h"
#include "model/arch_gemma.h"
#include "model/model.h"

namespace frink::arch {

int64_t gemma_query_pre_attn_scalar(std::string_view arch, int64_t n_layer, int64_t n_embd, int64_t n_head,
                                    int64_t head_dim) {
  const int64_t big_layers = arch == "gemma2" ? 46 : arch == "gemma3" ? 62 : -1;
  return n_layer == big_layers ? n_embd / n_head : head_dim;
}

namespace {

// Which layers attend through the sliding window: attention.sliding_window_pattern as one
// bool per layer when the file has it (SafeTensors configs list layer_types), else
// llama.cpp's set_swa_pattern(n): layer il is windowed when il % n < n - 1.
void set_window_pattern(const Metadata& meta, Hparams& hp, int64_t default_pattern) {
  const int64_t window = meta.get_int(key(hp, "attention.sliding_window"));
  const MetaValue* v = meta.find(key(hp, "attention.sliding_window_pattern"));
  if (v && v->is_array()) {
    if (static_cast<int64_t>(v->size()) != hp.n_layer)
      fail("{} has {} entries for {} layers", key(hp, "attention.sliding_window_pattern"), v->size(), hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (v->as_array()[static_cast<size_t>(il)].as_bool()) hp.layers[static_cast<size_t>(il)].window = window;
    return;
  }
  const int64_t pattern = v ? v->as_int() : default_pattern;
  if (pattern <= 0) fail("{} = {} is not a layer pattern", key(hp, "attention.sliding_window_pattern"), pattern);
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (il % pattern < pattern - 1) hp.layers[static_cast<size_t>(il)].window = window;
}

// 1/sqrt(query_pre_attn_scalar) on every layer (arch_gemma.h); attention.scale is not read.
void set_query_scale(Hparams& hp) {
  for (auto& p : hp.layers)
    p.attn_scale = 1.0f / std::sqrt(static_cast<float>(
                              gemma_query_pre_attn_scalar(hp.arch, hp.n_layer, hp.n_embd, p.n_head, p.head_dim_k)));
}

void read_gemma_common(const Metadata& meta, Hparams& hp) {
  read_common(meta, hp, RopeKind::kNeox);
  hp.norm = NormKind::kRms;
  hp.norm_eps = static_cast<float>(meta.get_float(key(hp, "attention.layer_norm_rms_epsilon")));
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  for (auto& p : hp.layers) {
    p.act = Activation::kGeluTanh;
    p.post_attn_norm = true;
    p.post_ffn_norm = true;
  }
}

void read_gemma2(const Metadata& meta, Hparams& hp) {
  read_gemma_common(meta, hp);
  const float attn_cap = static_cast<float>(meta.try_float(key(hp, "attn_logit_softcapping")).value_or(50.0));
  hp.final_softcap = static_cast<float>(meta.try_float(key(hp, "final_logit_softcapping")).value_or(30.0));
  // llama.cpp computes gemma2's query scale from the head size (1/sqrt(hd)), as read_common
  // already set; attention.scale in the file is not read.
  for (auto& p : hp.layers) p.attn_softcap = attn_cap;
  set_window_pattern(meta, hp, 2);
  set_query_scale(hp);
}

void read_gemma3(const Metadata& meta, Hparams& hp) {
  read_gemma_common(meta, hp);
  const float base_swa = static_cast<float>(meta.try_float(key(hp, "rope.freq_base_swa")).value_or(10000.0));
  for (auto& p : hp.layers) p.qk_norm = true;
  set_window_pattern(meta, hp, 6);
  set_query_scale(hp);
  // Local layers use their own base and no position scaling (HF's rope_local_base_freq).
  for (auto& p : hp.layers)
    if (p.window > 0) {
      p.rope.freq_base = base_swa;
      p.rope.freq_scale = 1.0f;
    }
}

void load_gemma(const Hparams& hp, WeightLoader& ld, Weights& w, bool qk_norm) {
  load_io(hp, ld, w);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    // gemma's graph applies q/k/v biases and scales when present, the output scale but
    // not an output bias, and nothing extra on the FFN.
    const LayerExtras x{{true, true}, {false, true}, {false, false}};
    load_attention(hp, ld, il, l, x);
    if (qk_norm) {
      l.q_norm = ld.norm(blk(il, "attn_q_norm"), p.head_dim_k, false, true);
      l.k_norm = ld.norm(blk(il, "attn_k_norm"), p.head_dim_k, false, true);
    }
    l.post_attn_norm = ld.norm(blk(il, "post_attention_norm"), hp.n_embd, false, true);
    load_ffn(hp, ld, il, l, x);
    l.post_ffn_norm = ld.norm(blk(il, "post_ffw_norm"), hp.n_embd, false, true);
  }
}

void load_gemma2(const Hparams& hp, WeightLoader& ld, Weights& w) { load_gemma(hp, ld, w, false); }
void load_gemma3(const Hparams& hp, WeightLoader& ld, Weights& w) { load_gemma(hp, ld, w, true); }

}  // namespace

extern const ArchDef kGemma2{"gemma2", read_gemma2, load_gemma2};
extern const ArchDef kGemma3{"gemma3", read_gemma3, load_gemma3};

}  // namespace frink::arch
