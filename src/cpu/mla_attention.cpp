#include "cpu/mla_attention.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "quant/quant.h"

namespace frink::cpu {

namespace {

using Buf = std::vector<float>;

Buf make(int64_t n) { return Buf(static_cast<size_t>(n)); }

// Per-head products with a stack of matrices {n_in, n_out, n_head} (wk_b, wv_b):
// y[t * y_stride + h * n_out ...] = W_h x[t * x_stride + h * x_head ...], for every token t and
// head h. Like ggml_mul_mat, the input is first converted to the weight type's vec_dot_type.
void head_matmul(const Experts& w, int64_t n_head, const float* x, int64_t x_stride, int64_t x_head, int64_t n_tok,
                 float* y, int64_t y_stride, ThreadPool& pool) {
  const TensorView& tv = *w.w;
  const int64_t n_in = w.n_in(), n_out = w.n_out();
  const GgmlType act_type = vec_dot_type(tv.type);
  const size_t act_bytes = ggml_row_bytes(act_type, n_in);
  pool.parallel_for(n_tok * n_head, [&](int64_t b, int64_t e, int) {
    std::vector<uint8_t> act(act_bytes);
    for (int64_t job = b; job < e; ++job) {
      const int64_t t = job / n_head, hh = job % n_head;
      quantize_row(act_type, x + t * x_stride + hh * x_head, act.data(), n_in);
      vec_dot_rows(tv.type, tv.row(hh * n_out), tv.row_bytes(), n_out, act.data(), n_in, y + t * y_stride + hh * n_out);
    }
  });
}

// q [n_tok][n_head][W] (W = R + n_rot, the cache row width) against the cache rows
// [0, pos0 + t] of each token t: softmax(q . row * attn_scale) weighs the rows' first R
// floats (V lives in the K row). out [n_tok][n_head][R].
void attend_latent(const LayerPlan& p, const KvCache& cache, const float* q, int64_t n_tok, int64_t pos0, float* out,
                   ThreadPool& pool) {
  const int64_t H = p.n_head, R = p.mla.kv_lora_rank, W = cache.k_width();
  pool.parallel_for(n_tok * H, [&](int64_t b, int64_t e, int) {
    Buf scores = make(pos0 + n_tok);
    for (int64_t job = b; job < e; ++job) {
      const int64_t t = job / H;
      const int64_t n = pos0 + t + 1;  // causal: keys at positions <= pos0 + t
      const float* qh = q + job * W;
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = cache.k(j);
        float s = 0.0f;
        for (int64_t d = 0; d < W; ++d) s += qh[d] * kj[d];
        scores[static_cast<size_t>(j)] = s * p.attn_scale;
      }
      softmax_inplace(scores.data(), n);
      float* oh = out + job * R;
      std::fill(oh, oh + R, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* vj = cache.v(j);
        const float a = scores[static_cast<size_t>(j)];
        for (int64_t d = 0; d < R; ++d) oh[d] += a * vj[d];
      }
    }
  });
}

}  // namespace

void mla_attention(const Model& m, int64_t il, KvCache& cache, const float* h, int64_t n_tok, int64_t pos0,
                   float* out, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  FRINK_ASSERT(p.attn == AttnKind::kMla, "mla_attention on layer {} without MLA", il);
  FRINK_ASSERT(cache.rows() == pos0, "cache has {} rows at position {}", cache.rows(), pos0);
  FRINK_ASSERT(cache.k_width() == p.cache_k_width() && cache.v_width() == 0, "layer {}: not a compressed cache", il);
  const int64_t H = p.n_head, dk = p.head_dim_k, n_rot = p.rope.n_rot, nope = dk - n_rot;
  const int64_t R = p.mla.kv_lora_rank, W = R + n_rot, Q = p.mla.q_lora_rank;

  // q = q_b_proj(q_a_layernorm(q_a_proj(h)))   (or q_proj(h))          [n_tok][H][nope | rope]
  Buf q = make(n_tok * H * dk);
  if (w.wq_a) {
    Buf qa = make(n_tok * Q);
    linear(w.wq_a, h, n_tok, qa.data(), pool);
    for (int64_t t = 0; t < n_tok; ++t) rms_norm(qa.data() + t * Q, w.q_a_norm.w, qa.data() + t * Q, Q, hp.norm_eps);
    linear(w.wq_b, qa.data(), n_tok, q.data(), pool);
  } else {
    linear(w.wq, h, n_tok, q.data(), pool);
  }

  // compressed_kv, k_pe = kv_a_proj_with_mqa(h).split([R, n_rot]); c = kv_a_layernorm(...)
  // q_pe, k_pe = apply_rotary_pos_emb(q_pe, k_pe); the cache row is [c | k_pe]
  Buf kv = make(n_tok * W);
  linear(w.wkv_a_mqa, h, n_tok, kv.data(), pool);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* qt = q.data() + t * H * dk;
    float* kt = kv.data() + t * W;
    // llama.cpp's deepseek2 graph passes no frequency factors to either rope.
    for (int64_t hh = 0; hh < H; ++hh) rope(p.rope, nullptr, qt + hh * dk + nope, 1, n_rot, pos0 + t);
    rope(p.rope, nullptr, kt + R, 1, n_rot, pos0 + t);
    rms_norm(kt, w.kv_a_norm.w, kt, R, hp.norm_eps);
    cache.append(kt, nullptr);
  }

  // Absorption: q_full_h = [wk_b_h q_nope_h | q_pe_h], so q_full_h . [c_j | k_pe_j] equals
  // the expanded q_h . [k_nope_hj | k_pe_j] with k_nope_hj = wk_b_h^T c_j.
  Buf qf = make(n_tok * H * W);
  // wk_b's output rows go to [t][h][0, R); the row stride W leaves room for q_pe.
  {
    Buf qabs = make(n_tok * H * R);
    head_matmul(w.wk_b, H, q.data(), H * dk, dk, n_tok, qabs.data(), H * R, pool);
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t hh = 0; hh < H; ++hh) {
        float* dst = qf.data() + (t * H + hh) * W;
        const float* qa = qabs.data() + (t * H + hh) * R;
        const float* qpe = q.data() + t * H * dk + hh * dk + nope;
        std::copy(qa, qa + R, dst);
        std::copy(qpe, qpe + n_rot, dst + R);
      }
  }

  // attn = softmax(q k^T * scale) over the compressed rows, then each head's wv_b
  // decompresses its weighted sum of c: o_h = wv_b_h (sum_j a_hj c_j)
  Buf ctx = make(n_tok * H * R);
  attend_latent(p, cache, qf.data(), n_tok, pos0, ctx.data(), pool);
  Buf o = make(n_tok * H * p.head_dim_v);
  head_matmul(w.wv_b, H, ctx.data(), H * R, R, n_tok, o.data(), H * p.head_dim_v, pool);

  // o_proj(attn_output)
  linear(w.wo, o.data(), n_tok, out, pool);
}

}  // namespace frink::cpu
