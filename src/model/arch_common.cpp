#include "model/arch_common.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace frink::arch {

std::string key(const Hparams& hp, std::string_view suffix) { return fmt::format("{}.{}", hp.arch, suffix); }

namespace {

// A key that is either one number for every layer or an array with one per layer
// (llama.cpp's get_key_or_arr).
std::vector<int64_t> per_layer(const Metadata& meta, const std::string& k, int64_t n_layer,
                               std::optional<int64_t> fallback) {
  const MetaValue* v = meta.find(k);
  if (!v) {
    if (!fallback) fail("missing metadata key {}", k);
    return std::vector<int64_t>(static_cast<size_t>(n_layer), *fallback);
  }
  if (v->is_array()) {
    auto arr = v->as_ints();
    if (static_cast<int64_t>(arr.size()) < n_layer)
      fail("metadata key {} has {} entries for {} layers", k, arr.size(), n_layer);
    arr.resize(static_cast<size_t>(n_layer));
    return arr;
  }
  return std::vector<int64_t>(static_cast<size_t>(n_layer), v->as_int());
}

int64_t positive(const Metadata& meta, const std::string& k, int64_t v, int64_t hi) {
  if (v <= 0 || v > hi) fail("metadata key {} = {} is out of range", k, v);
  return v;
}

}  // namespace

void read_common(const Metadata& meta, Hparams& hp, RopeKind rope, bool allow_headless) {
  constexpr int64_t kMaxDim = int64_t{1} << 24;  // far above any real model; guards overflow
  hp.name = meta.try_string("general.name").value_or("");
  hp.n_embd = positive(meta, key(hp, "embedding_length"), meta.get_int(key(hp, "embedding_length")), kMaxDim);
  hp.n_layer = positive(meta, key(hp, "block_count"), meta.get_int(key(hp, "block_count")), 4096);
  hp.n_ctx_train = meta.try_int(key(hp, "context_length")).value_or(2048);
  if (auto nv = meta.try_int(key(hp, "vocab_size"))) {
    hp.n_vocab = *nv;
  } else if (const MetaValue* toks = meta.find("tokenizer.ggml.tokens")) {
    hp.n_vocab = static_cast<int64_t>(toks->size());
  }

  const int64_t L = hp.n_layer;
  auto n_head = per_layer(meta, key(hp, "attention.head_count"), L, std::nullopt);
  auto n_head_kv = per_layer(meta, key(hp, "attention.head_count_kv"), L, n_head[0]);
  auto n_ff = per_layer(meta, key(hp, "feed_forward_length"), L, int64_t{0});
  const int64_t hd_k = meta.try_int(key(hp, "attention.key_length")).value_or(n_head[0] ? hp.n_embd / n_head[0] : 0);
  const int64_t hd_v = meta.try_int(key(hp, "attention.value_length")).value_or(n_head[0] ? hp.n_embd / n_head[0] : 0);
  positive(meta, key(hp, "attention.key_length"), hd_k, kMaxDim);
  positive(meta, key(hp, "attention.value_length"), hd_v, kMaxDim);

  RopeParams rp;
  rp.kind = rope;
  rp.n_rot = meta.try_int(key(hp, "rope.dimension_count")).value_or(hd_k);
  if (rp.n_rot < 0 || rp.n_rot > hd_k || rp.n_rot % 2 != 0)
    fail("metadata key {} = {} does not fit a head of {}", key(hp, "rope.dimension_count"), rp.n_rot, hd_k);
  rp.freq_base = static_cast<float>(meta.try_float(key(hp, "rope.freq_base")).value_or(10000.0));
  // llama.cpp: rope.scaling.factor (or the older rope.scale_linear) gives freq_scale = 1/factor;
  // a factor of 0 means no scaling.
  double factor = meta.try_float(key(hp, "rope.scaling.factor"))
                      .value_or(meta.try_float(key(hp, "rope.scale_linear")).value_or(0.0));
  std::string scaling = meta.try_string(key(hp, "rope.scaling.type")).value_or(factor != 0 ? "linear" : "none");
  if (scaling == "none") factor = 0;
  rp.freq_scale = factor == 0.0 ? 1.0f : static_cast<float>(1.0 / factor);
  rp.n_ctx_orig = meta.try_int(key(hp, "rope.scaling.original_context_length")).value_or(hp.n_ctx_train);
  if (scaling == "yarn") {
    rp.ext_factor = 1.0f;
    rp.beta_fast = static_cast<float>(meta.try_float(key(hp, "rope.scaling.yarn_beta_fast")).value_or(32.0));
    rp.beta_slow = static_cast<float>(meta.try_float(key(hp, "rope.scaling.yarn_beta_slow")).value_or(1.0));
    // Not a llama.cpp key: set only by the SafeTensors translation (rope_parameters.truncate).
    rp.yarn_truncate = meta.try_bool(key(hp, "rope.scaling.yarn_truncate")).value_or(true);
  } else if (scaling != "linear" && scaling != "none") {
    fail("rope scaling '{}' is not supported", scaling);
  }

  hp.layers.assign(static_cast<size_t>(L), LayerPlan{});
  for (int64_t il = 0; il < L; ++il) {
    LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    if (allow_headless && n_head[il] == 0) {
      p.n_ff = n_ff[il];
      p.rope = rp;
      continue;
    }
    p.n_head = positive(meta, key(hp, "attention.head_count"), n_head[il], 65536);
    p.n_head_kv = positive(meta, key(hp, "attention.head_count_kv"), n_head_kv[il], p.n_head);
    if (p.n_head % p.n_head_kv != 0)
      fail("{} query heads do not divide into {} key/value heads", p.n_head, p.n_head_kv);
    p.head_dim_k = hd_k;
    p.head_dim_v = hd_v;
    p.n_ff = n_ff[il];
    p.rope = rp;
    p.attn_scale = 1.0f / std::sqrt(static_cast<float>(hd_k));
  }
}

WeightLoader::LinearOpts attn_opts(const Extras& e) { return {e.bias, e.scale, false, true}; }
WeightLoader::LinearOpts ffn_opts(const Extras& e) { return {e.bias, e.scale, true, true}; }

void load_attention(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const LayerExtras& x) {
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const bool ln = hp.norm == NormKind::kLayer;
  l.attn_norm = ld.norm(blk(il, "attn_norm"), hp.n_embd, ln, true);
  l.wq = ld.linear(blk(il, "attn_q"), hp.n_embd, p.n_head * p.head_dim_k, attn_opts(x.qkv));
  l.wk = ld.linear(blk(il, "attn_k"), hp.n_embd, p.n_head_kv * p.head_dim_k, attn_opts(x.qkv));
  l.wv = ld.linear(blk(il, "attn_v"), hp.n_embd, p.n_head_kv * p.head_dim_v, attn_opts(x.qkv));
  l.wo = ld.linear(blk(il, "attn_output"), p.n_head * p.head_dim_v, hp.n_embd, attn_opts(x.wo));
}

void load_ffn(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const LayerExtras& x) {
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const bool ln = hp.norm == NormKind::kLayer;
  l.ffn_norm = ld.norm(blk(il, "ffn_norm"), hp.n_embd, ln, true);
  const int64_t up_width = p.ffn == FfnKind::kGatedFused ? 2 * p.n_ff : p.n_ff;
  if (p.ffn == FfnKind::kGated) l.ffn_gate = ld.linear(blk(il, "ffn_gate"), hp.n_embd, p.n_ff, ffn_opts(x.ffn));
  l.ffn_up = ld.linear(blk(il, "ffn_up"), hp.n_embd, up_width, ffn_opts(x.ffn));
  l.ffn_down = ld.linear(blk(il, "ffn_down"), p.n_ff, hp.n_embd, ffn_opts(x.ffn));
}

void load_io(const Hparams& hp, WeightLoader& ld, Weights& w) {
  w.tok_embd = ld.matrix("token_embd.weight", {hp.n_embd, hp.n_vocab}, true);
  w.output_norm = ld.norm("output_norm", hp.n_embd, hp.norm == NormKind::kLayer, true);
  w.output = ld.linear("output", hp.n_embd, hp.n_vocab, {false, false, false, false});
  if (!w.output) w.output.w = w.tok_embd;  // tied embeddings
}

}  // namespace frink::arch
