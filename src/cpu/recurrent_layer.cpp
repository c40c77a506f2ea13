#include "cpu/recurrent_layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "cpu/delta_rule.h"
#include "cpu/layer_body.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"

namespace frink::cpu {

namespace {

using Buf = std::vector<float>;

Buf make(int64_t n) { return Buf(static_cast<size_t>(n)); }

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// ggml's softplus: log(1 + e^x), and x itself above 20 where the two agree in f32.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Causal depthwise convolution over [n][C] rows (ggml_ssm_conv): channel c of output t is
// sum_j w[c][j] * in[t + j - (K-1)], reading the state's K-1 rows before token 0, then
// (+ bias) and SiLU. The state becomes the last K-1 inputs.
void conv1d_silu(const float* w, const float* bias, int64_t K, int64_t C, float* conv_state, float* io,
                 int64_t n, ThreadPool& pool) {
  // in = state rows then the n new rows: [(K - 1 + n)][C]
  Buf in = make((K - 1 + n) * C);
  std::copy(conv_state, conv_state + (K - 1) * C, in.begin());
  std::copy(io, io + n * C, in.begin() + (K - 1) * C);
  pool.parallel_for(C, [&](int64_t c0, int64_t c1, int) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = c0; c < c1; ++c) {
        float s = 0.0f;
        for (int64_t j = 0; j < K; ++j) s += in[static_cast<size_t>((t + j) * C + c)] * w[c * K + j];
        if (bias) s += bias[c];
        io[t * C + c] = s / (1.0f + std::exp(-s));
      }
  }, 64);
  std::copy(in.end() - (K - 1) * C, in.end(), conv_state);
}

// The conv state as it stood after token `end` of the batch (end >= 1): the K-1 inputs
// before position end, from the old state and the batch's raw inputs.
void conv_state_at(const float* old_state, const float* raw, int64_t K, int64_t C, int64_t end, float* out) {
  for (int64_t r = 0; r < K - 1; ++r) {
    const int64_t t = end - (K - 1) + r;  // batch row; negative: from the old state
    const float* src = t >= 0 ? raw + t * C : old_state + (K - 1 + t) * C;
    std::copy(src, src + C, out + r * C);
  }
}

// After the scan reached end_pos, keeps this layer's snapshot there when the state wants one.
// The conv ran over the whole batch first, so for a snapshot inside the batch the conv state
// at end_pos is rebuilt from the kept inputs (old_conv, raw) for the save, then the live one
// is put back.
void save_segment_snapshot(RecurrentState& st, int64_t il, int64_t pos0, int64_t n, int64_t end_pos, bool split,
                           const std::vector<float>& old_conv, const std::vector<float>& raw, int64_t K, int64_t C) {
  if (end_pos == pos0 + n && !st.wants_snapshot(end_pos, pos0, pos0 + n)) return;
  if (!split) {
    st.save_layer(end_pos, il);
    return;
  }
  float* conv_state = st.conv(il);
  const std::vector<float> live(conv_state, conv_state + (K - 1) * C);
  conv_state_at(old_conv.data(), raw.data(), K, C, end_pos - pos0, conv_state);
  st.save_layer(end_pos, il);
  std::copy(live.begin(), live.end(), conv_state);
}

// Positions in (pos0, pos0 + n] after which the state keeps a snapshot, always ending with
// pos0 + n: the batch is processed in the segments between them.
std::vector<int64_t> segment_ends(const RecurrentState& st, int64_t pos0, int64_t n) {
  std::vector<int64_t> ends;
  for (int64_t p = pos0 + 1; p <= pos0 + n; ++p)
    if (st.wants_snapshot(p, pos0, pos0 + n) || p == pos0 + n) ends.push_back(p);
  return ends;
}

// x += branch; x += ffn(rms(x) * ffn_norm)
void residual_and_ffn(const Model& m, const LayerPlan& p, const LayerWeights& w, const float* branch, float* x,
                      int64_t n, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const int64_t E = hp.n_embd;
  for (int64_t i = 0; i < n * E; ++i) x[i] += branch[i];
  Buf h = make(n * E), f = make(n * E);
  for (int64_t t = 0; t < n; ++t) norm(hp.norm, w.ffn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);
  feed_forward(m, p, w, h.data(), n, f.data(), pool);
  for (int64_t i = 0; i < n * E; ++i) x[i] += f[static_cast<size_t>(i)];
}

// ggml_l2_norm: x / max(||x||, eps), the sum of squares in double.
void l2_norm(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void delta_net_layer(const Model& m, int64_t il, RecurrentState& st, float* x, int64_t n, int64_t pos0,
                     int64_t chunk, ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  const SsmPlan& s = p.ssm;
  const int64_t E = hp.n_embd, C = s.conv_channels(), K = s.d_conv, d = s.d_state;
  const int64_t nk = s.n_group, nv = s.n_v_head, rf = nv / nk, V = s.d_inner;

  // h = rms(x) * attn_norm; qkv = attn_qkv h; z = attn_gate h
  Buf h = make(n * E);
  for (int64_t t = 0; t < n; ++t) norm(hp.norm, w.attn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);
  Buf qkv = make(n * C), z = make(n * V), beta = make(n * nv), g = make(n * nv);
  linear(w.ssm_qkv, h.data(), n, qkv.data(), pool);
  linear(w.ssm_z, h.data(), n, z.data(), pool);
  Buf alpha = make(n * nv);
  if (w.ssm_ba) {
    // per key head [beta (rf) | alpha (rf)]; value head = key head * rf + r
    Buf ba = make(n * 2 * nv);
    linear(w.ssm_ba, h.data(), n, ba.data(), pool);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t kh = 0; kh < nk; ++kh)
        for (int64_t r = 0; r < rf; ++r) {
          beta[t * nv + kh * rf + r] = ba[t * 2 * nv + kh * 2 * rf + r];
          alpha[t * nv + kh * rf + r] = ba[t * 2 * nv + kh * 2 * rf + rf + r];
        }
  } else {
    linear(w.ssm_beta, h.data(), n, beta.data(), pool);
    linear(w.ssm_alpha, h.data(), n, alpha.data(), pool);
  }
  // beta = sigmoid(b); g = softplus(a + dt_bias) * ssm_a
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < nv; ++hh) {
      beta[t * nv + hh] = sigmoid(beta[t * nv + hh]);
      g[t * nv + hh] = softplus(alpha[t * nv + hh] + w.ssm_dt_b[hh]) * w.ssm_a[hh];
    }

  // conv (the raw inputs kept for snapshots inside the batch), then l2-normed q and k
  float* conv_state = st.conv(il);
  const std::vector<int64_t> ends = segment_ends(st, pos0, n);
  Buf raw, old_conv;
  if (ends.size() > 1) {
    raw = qkv;
    old_conv.assign(conv_state, conv_state + (K - 1) * C);
  }
  conv1d_silu(w.ssm_conv1d, nullptr, K, C, conv_state, qkv.data(), n, pool);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t kh = 0; kh < 2 * nk; ++kh) l2_norm(qkv.data() + t * C + kh * d, d, hp.norm_eps);

  // the delta rule per value head, segment by segment
  Buf o = make(n * V);
  float* S = st.ssm(il);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  int64_t begin = 0;
  for (int64_t end_pos : ends) {
    const int64_t b = begin, e = end_pos - pos0;
    pool.parallel_for(nv, [&](int64_t h0, int64_t h1, int) {
      for (int64_t hv = h0; hv < h1; ++hv) {
        const int64_t hk = s.kv_head_tiled ? hv % nk : hv / rf;
        DeltaRuleSeq seq;
        seq.q = qkv.data() + b * C + hk * d;
        seq.k = qkv.data() + b * C + nk * d + hk * d;
        seq.v = qkv.data() + b * C + 2 * nk * d + hv * d;
        seq.qk_stride = seq.v_stride = C;
        seq.g = g.data() + b * nv + hv;
        seq.beta = beta.data() + b * nv + hv;
        seq.gb_stride = nv;
        seq.out = o.data() + b * V + hv * d;
        seq.out_stride = V;
        seq.n = e - b;
        seq.d = d;
        seq.q_scale = q_scale;
        if (chunk > 0 && seq.n > 1)
          delta_rule_chunked(seq, S + hv * d * d, chunk);
        else
          delta_rule_recurrent(seq, S + hv * d * d);
      }
    });
    save_segment_snapshot(st, il, pos0, n, end_pos, ends.size() > 1, old_conv, raw, K, C);
    begin = e;
  }

  // o = rms(o) * ssm_norm * silu(z) per value head; x += ssm_out o
  for (int64_t r = 0; r < n * nv; ++r) {
    float* oh = o.data() + r * d;
    const float* zh = z.data() + r * d;
    rms_norm(oh, w.ssm_norm, oh, d, hp.norm_eps);
    for (int64_t j = 0; j < d; ++j) oh[j] *= zh[j] / (1.0f + std::exp(-zh[j]));
  }
  Buf out = make(n * E);
  linear(w.ssm_out, o.data(), n, out.data(), pool);
  residual_and_ffn(m, p, w, out.data(), x, n, pool);
}

void mamba2_layer(const Model& m, int64_t il, RecurrentState& st, float* x, int64_t n, int64_t pos0,
                  ThreadPool& pool) {
  const Hparams& hp = m.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  const SsmPlan& s = p.ssm;
  const int64_t E = hp.n_embd, C = s.conv_channels(), K = s.d_conv, N = s.d_state;
  const int64_t H = s.n_v_head, G = s.n_group, P = s.d_inner / H, DI = s.d_inner, W = DI + C + H;

  // h = rms(x) * attn_norm; z | xBC | dt = ssm_in h
  Buf h = make(n * E), zxbcdt = make(n * W);
  for (int64_t t = 0; t < n; ++t) norm(hp.norm, w.attn_norm, x + t * E, h.data() + t * E, E, hp.norm_eps);
  linear(w.ssm_in, h.data(), n, zxbcdt.data(), pool);
  Buf xbc = make(n * C);
  for (int64_t t = 0; t < n; ++t)
    std::copy(zxbcdt.begin() + t * W + DI, zxbcdt.begin() + t * W + DI + C, xbc.begin() + t * C);
  float* conv_state = st.conv(il);
  const std::vector<int64_t> ends = segment_ends(st, pos0, n);
  Buf raw, old_conv;
  if (ends.size() > 1) {
    raw = xbc;
    old_conv.assign(conv_state, conv_state + (K - 1) * C);
  }
  conv1d_silu(w.ssm_conv1d, w.ssm_conv1d_b, K, C, conv_state, xbc.data(), n, pool);

  // The selective scan (ggml_ssm_scan, Mamba-2 branch): head hh reads group hh / (H / G).
  Buf y = make(n * DI);
  float* S = st.ssm(il);
  int64_t begin = 0;
  for (int64_t end_pos : ends) {
    const int64_t b = begin, e = end_pos - pos0;
    pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
      for (int64_t hh = h0; hh < h1; ++hh) {
        const int64_t gg = hh / (H / G);
        float* sh = S + hh * P * N;
        for (int64_t t = b; t < e; ++t) {
          const float* xt = xbc.data() + t * C + hh * P;
          const float* Bt = xbc.data() + t * C + DI + gg * N;
          const float* Ct = xbc.data() + t * C + DI + G * N + gg * N;
          const float dt = softplus(zxbcdt[t * W + DI + C + hh] + w.ssm_dt_b[hh]);
          const float dA = std::exp(dt * w.ssm_a[hh]);
          for (int64_t pp = 0; pp < P; ++pp) {
            const float x_dt = xt[pp] * dt;
            float* row = sh + pp * N;
            float sum = 0.0f;
            for (int64_t i = 0; i < N; ++i) {
              const float v = row[i] * dA + Bt[i] * x_dt;
              sum += v * Ct[i];
              row[i] = v;
            }
            y[t * DI + hh * P + pp] = sum;
          }
        }
      }
    });
    save_segment_snapshot(st, il, pos0, n, end_pos, ends.size() > 1, old_conv, raw, K, C);
    begin = e;
  }

  // y = (y + D x) * silu(z); grouped rms * ssm_norm; x += ssm_out y
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y.data() + t * DI;
    const float* xt = xbc.data() + t * C;
    const float* zt = zxbcdt.data() + t * W;
    for (int64_t i = 0; i < DI; ++i) {
      const float v = yt[i] + xt[i] * w.ssm_d[i / P];
      yt[i] = zt[i] / (1.0f + std::exp(-zt[i])) * v;
    }
    if (w.ssm_norm)
      for (int64_t gg = 0; gg < G; ++gg)
        rms_norm(yt + gg * (DI / G), w.ssm_norm + gg * (DI / G), yt + gg * (DI / G), DI / G, hp.norm_eps);
  }
  Buf out = make(n * E);
  linear(w.ssm_out, y.data(), n, out.data(), pool);
  residual_and_ffn(m, p, w, out.data(), x, n, pool);
}

}  // namespace

RecurrentState::LayerShape recurrent_state_shape(const LayerPlan& p) {
  const SsmPlan& s = p.ssm;
  switch (p.recurrent) {
    case RecurrentKind::kNone: return {};
    case RecurrentKind::kGatedDeltaNet: return {(s.d_conv - 1) * s.conv_channels(), s.n_v_head * s.d_state * s.d_state};
    case RecurrentKind::kMamba2: return {(s.d_conv - 1) * s.conv_channels(), s.d_inner * s.d_state};
  }
  return {};
}

void recurrent_layer(const Model& m, int64_t il, RecurrentState& state, float* x, int64_t n_tok, int64_t pos0,
                     int64_t delta_chunk, ThreadPool& pool) {
  const LayerPlan& p = m.hp.layers[static_cast<size_t>(il)];
  if (p.recurrent == RecurrentKind::kGatedDeltaNet)
    delta_net_layer(m, il, state, x, n_tok, pos0, delta_chunk, pool);
  else if (p.recurrent == RecurrentKind::kMamba2)
    mamba2_layer(m, il, state, x, n_tok, pos0, pool);
  else
    FRINK_ASSERT(false, "layer {} is not recurrent", il);
}

}  // namespace frink::cpu
