#include "cpu/layer_body.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "cpu/matmul.h"
#include "cpu/mla_attention.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "quant/quant.h"

namespace frink::cpu {

namespace {

using Buf = std::vector<float>;

Buf make(int64_t n) { return Buf(static_cast<size_t>(n)); }

// q [n_tok][n_head*hd_k] against the cache rows [0, pos0 + t] of each token t;
// out [n_tok][n_head*hd_v]. sinks: [n_head] extra softmax logits (plan.attn_sinks) or null.
void attend(const LayerPlan& p, const KvCache& cache, const float* q, int64_t n_tok, int64_t pos0,
            float max_alibi_bias, const float* sinks, float* out, ThreadPool& pool) {
  const int64_t group = p.n_head / p.n_head_kv;
  const int64_t q_width = p.n_head * p.head_dim_k, o_width = p.n_head * p.head_dim_v;
  pool.parallel_for(n_tok * p.n_head, [&](int64_t b, int64_t e, int) {
    Buf scores = make(pos0 + n_tok);
    for (int64_t job = b; job < e; ++job) {
      const int64_t t = job / p.n_head, h = job % p.n_head, hk = h / group;
      const int64_t pos = pos0 + t;
      // Sliding window: a query at pos sees keys j with pos - j < window (llama.cpp's
      // is_masked_swa, standard type).
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      const int64_t n = pos + 1 - first;
      const float* qh = q + t * q_width + h * p.head_dim_k;
      const float slope = p.alibi ? alibi_slope(h, p.n_head, max_alibi_bias) : 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = cache.k(first + j) + hk * p.head_dim_k;
        // The SIMD f32 dot of the quant layer: this loop was 20% of a 1B model's prefill
        // when written as a scalar sum.
        float s = vec_dot(GgmlType::F32, kj, qh, p.head_dim_k);
        s *= p.attn_scale;
        if (p.attn_softcap > 0.0f) s = p.attn_softcap * std::tanh(s / p.attn_softcap);
        if (p.alibi) s -= slope * static_cast<float>(pos - (first + j));
        scores[static_cast<size_t>(j)] = s;
      }
      if (sinks)
        softmax_sink_inplace(scores.data(), n, sinks[h]);
      else
        softmax_inplace(scores.data(), n);
      float* oh = out + t * o_width + h * p.head_dim_v;
      std::fill(oh, oh + p.head_dim_v, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* vj = cache.v(first + j) + hk * p.head_dim_v;
        const float a = scores[static_cast<size_t>(j)];
        for (int64_t d = 0; d < p.head_dim_v; ++d) oh[d] += a * vj[d];
      }
    }
  });
}

// The feed-forward block on normed input h [n_tok][n_embd] -> out [n_tok][n_embd].
void ffn(const Model& m, const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok,
         float* out, ThreadPool& pool) {
  const int64_t n_ff = p.n_ff;
  auto act = [&](float* v, int64_t n) {
    if (p.act == Activation::kSilu)
      silu_inplace(v, n);
    else
      gelu_tanh_inplace(v, n);
  };
  Buf hidden = make(n_tok * n_ff);
  if (p.ffn == FfnKind::kGated) {
    // self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    Buf up = make(n_tok * n_ff);
    linear(w.ffn_gate, h, n_tok, hidden.data(), pool);
    linear(w.ffn_up, h, n_tok, up.data(), pool);
    act(hidden.data(), n_tok * n_ff);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] *= up[i];
  } else if (p.ffn == FfnKind::kGatedFused) {
    // gate, up = self.gate_up_proj(x).chunk(2, dim=-1); down(act(gate) * up)
    Buf gu = make(n_tok * 2 * n_ff);
    linear(w.ffn_up, h, n_tok, gu.data(), pool);
    for (int64_t t = 0; t < n_tok; ++t) {
      float* g = gu.data() + t * 2 * n_ff;
      act(g, n_ff);
      for (int64_t i = 0; i < n_ff; ++i) hidden[static_cast<size_t>(t * n_ff + i)] = g[i] * g[n_ff + i];
    }
  } else {
    // self.c_proj(self.act(self.c_fc(x)))
    linear(w.ffn_up, h, n_tok, hidden.data(), pool);
    act(hidden.data(), n_tok * n_ff);
  }
  linear(w.ffn_down, hidden.data(), n_tok, out, pool);
}

}  // namespace

void feed_forward(const Model& m, const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok,
                  float* out, ThreadPool& pool) {
  if (p.ffn == FfnKind::kMoe)
    moe_ffn(p, w, h, n_tok, m.hp.n_embd, out, pool);
  else
    ffn(m, p, w, h, n_tok, out, pool);
}

namespace {

// Grouped-query attention on normed input h [n_tok][n_embd] -> o [n_tok][n_embd] (after wo);
// appends the tokens' K/V rows to the cache.
void gqa_attention(const Model& m, const LayerPlan& p, const LayerWeights& w, KvCache& cache, const float* h,
                   int64_t n_tok, int64_t pos0, float* o, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const int64_t q_w = p.n_head * p.head_dim_k, k_w = p.n_head_kv * p.head_dim_k,
                v_w = p.n_head_kv * p.head_dim_v;

  // q, k, v = q_proj(h), k_proj(h), v_proj(h)   (or one fused qkv projection, split)
  Buf q = make(n_tok * q_w), k = make(n_tok * k_w), v = make(n_tok * v_w);
  Buf gate;  // p.attn_out_gate: [n_tok][n_head * head_dim]
  if (w.wqkv) {
    Buf qkv = make(n_tok * (q_w + k_w + v_w));
    linear(w.wqkv, h, n_tok, qkv.data(), pool);
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* row = qkv.data() + t * (q_w + k_w + v_w);
      std::copy(row, row + q_w, q.data() + t * q_w);
      std::copy(row + q_w, row + q_w + k_w, k.data() + t * k_w);
      std::copy(row + q_w + k_w, row + q_w + k_w + v_w, v.data() + t * v_w);
    }
  } else if (p.attn_out_gate) {
    // query_states, gate = torch.chunk(q_proj(h).view(..., head_dim * 2), 2, dim=-1)
    Buf qg = make(n_tok * 2 * q_w);
    gate = make(n_tok * q_w);
    linear(w.wq, h, n_tok, qg.data(), pool);
    for (int64_t r = 0; r < n_tok * p.n_head; ++r) {
      const float* row = qg.data() + r * 2 * p.head_dim_k;
      std::copy(row, row + p.head_dim_k, q.data() + r * p.head_dim_k);
      std::copy(row + p.head_dim_k, row + 2 * p.head_dim_k, gate.data() + r * p.head_dim_k);
    }
    linear(w.wk, h, n_tok, k.data(), pool);
    linear(w.wv, h, n_tok, v.data(), pool);
  } else {
    linear(w.wq, h, n_tok, q.data(), pool);
    linear(w.wk, h, n_tok, k.data(), pool);
    linear(w.wv, h, n_tok, v.data(), pool);
  }

  // q = q_norm(q), k = k_norm(k) per head; then apply_rotary_pos_emb(q, k, cos, sin)
  const float* ff = p.rope.use_freq_factors ? m.w.rope_freqs : nullptr;
  for (int64_t t = 0; t < n_tok; ++t) {
    float* qt = q.data() + t * q_w;
    float* kt = k.data() + t * k_w;
    if (p.qk_norm_full) {
      // olmoe: one RMSNorm over the whole q and the whole k projection
      rms_norm(qt, w.q_norm.w, qt, q_w, hp.norm_eps);
      rms_norm(kt, w.k_norm.w, kt, k_w, hp.norm_eps);
    }
    if (p.qk_norm) {
      for (int64_t hh = 0; hh < p.n_head; ++hh)
        rms_norm(qt + hh * p.head_dim_k, w.q_norm.w, qt + hh * p.head_dim_k, p.head_dim_k, hp.norm_eps);
      for (int64_t hh = 0; hh < p.n_head_kv; ++hh)
        rms_norm(kt + hh * p.head_dim_k, w.k_norm.w, kt + hh * p.head_dim_k, p.head_dim_k, hp.norm_eps);
    }
    rope(p.rope, ff, qt, p.n_head, p.head_dim_k, pos0 + t);
    rope(p.rope, ff, kt, p.n_head_kv, p.head_dim_k, pos0 + t);
    cache.append(kt, v.data() + t * v_w);
  }

  // attn_output = softmax(q k^T * scale + mask) v ; o_proj(attn_output)
  Buf attn = make(n_tok * p.n_head * p.head_dim_v);
  attend(p, cache, q.data(), n_tok, pos0, hp.max_alibi_bias, p.attn_sinks ? w.attn_sinks : nullptr, attn.data(), pool);
  // attn_output = attn_output * torch.sigmoid(gate)   (Qwen3-Next's gated attention)
  if (p.attn_out_gate)
    for (size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  linear(w.wo, attn.data(), n_tok, o, pool);
}

}  // namespace

void embed_tokens(const Model& m, const int32_t* tokens, int64_t n_tok, float* x) {
  const Hparams& hp = m.hp;
  for (int64_t t = 0; t < n_tok; ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp.n_vocab)
      fail("token id {} is outside the vocabulary of {} tokens", tokens[t], hp.n_vocab);
    float* row = x + t * hp.n_embd;
    embedding_row(*m.w.tok_embd, tokens[t], row);
    if (hp.embd_scale > 0.0f)
      for (int64_t i = 0; i < hp.n_embd; ++i) row[i] *= hp.embd_scale;
    if (hp.embd_norm) norm(hp.norm, m.w.embd_norm, row, row, hp.n_embd, hp.norm_eps);
  }
}

void attention_layer(const Model& m, int64_t il, KvCache& cache, float* x, int64_t n_tok,
                     int64_t pos0, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  FRINK_ASSERT(cache.rows() == pos0, "cache has {} rows at position {}", cache.rows(), pos0);
  const int64_t E = hp.n_embd;

  // h = self.input_layernorm(x)
  Buf h = make(n_tok * E);
  for (int64_t t = 0; t < n_tok; ++t) norm(hp.norm, w.attn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);

  // attn_output = self.self_attn(h): grouped-query attention, or DeepSeek's latent attention
  Buf o = make(n_tok * E);
  if (p.attn == AttnKind::kMla)
    mla_attention(m, il, cache, h.data(), n_tok, pos0, o.data(), pool);
  else
    gqa_attention(m, p, w, cache, h.data(), n_tok, pos0, o.data(), pool);
  if (p.post_attn_norm)
    for (int64_t t = 0; t < n_tok; ++t) norm(hp.norm, w.post_attn_norm, o.data() + t * E, o.data() + t * E, E, hp.norm_eps);

  Buf f = make(n_tok * E);
  if (p.parallel_residual) {
    // x + attn(ln(x)) + mlp(ln(x)): the FFN reads the same normed input (or its own norm).
    if (w.ffn_norm) {
      for (int64_t t = 0; t < n_tok; ++t) norm(hp.norm, w.ffn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);
    }
    feed_forward(m, p, w, h.data(), n_tok, f.data(), pool);
    for (int64_t i = 0; i < n_tok * E; ++i) x[i] += o[static_cast<size_t>(i)] + f[static_cast<size_t>(i)];
    return;
  }
  // x = x + attn ; x = x + mlp(post_attention_layernorm(x))
  for (int64_t i = 0; i < n_tok * E; ++i) x[i] += o[static_cast<size_t>(i)];
  for (int64_t t = 0; t < n_tok; ++t) norm(hp.norm, w.ffn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);
  feed_forward(m, p, w, h.data(), n_tok, f.data(), pool);
  if (p.post_ffn_norm)
    for (int64_t t = 0; t < n_tok; ++t) norm(hp.norm, w.post_ffn_norm, f.data() + t * E, f.data() + t * E, E, hp.norm_eps);
  for (int64_t i = 0; i < n_tok * E; ++i) x[i] += f[static_cast<size_t>(i)];
}

void output_logits(const Model& m, const float* x, int64_t n_tok, float* logits, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  Buf h = make(n_tok * hp.n_embd);
  for (int64_t t = 0; t < n_tok; ++t)
    norm(hp.norm, m.w.output_norm, x + t * hp.n_embd, h.data() + t * hp.n_embd, hp.n_embd, hp.norm_eps);
  linear(m.w.output, h.data(), n_tok, logits, pool);
  if (hp.final_softcap > 0.0f) softcap_inplace(logits, n_tok * hp.n_vocab, hp.final_softcap);
}

}  // namespace frink::cpu
