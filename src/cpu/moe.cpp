#include "cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "quant/quant.h"

namespace frink::cpu {

namespace {

using Buf = std::vector<float>;

// Weight rows per job, as in matmul.cpp: a tile of one expert's rows stays in cache while
// every token routed to that expert passes over it.
constexpr int64_t kRowTile = 16;

// llama.cpp clamps the sum of the chosen weights to the smallest normal f16 before dividing.
constexpr float kMinWeightSum = 6.103515625e-5f;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Activation rows converted once to the format a weight type's dot product reads.
struct ActRows {
  GgmlType type{};
  size_t row_bytes = 0;
  std::vector<uint8_t> data;
  const uint8_t* row(int64_t r) const { return data.data() + static_cast<size_t>(r) * row_bytes; }
};

ActRows convert_rows(GgmlType weight_type, const float* x, int64_t n_rows, int64_t n, ThreadPool& pool) {
  ActRows a;
  a.type = vec_dot_type(weight_type);
  a.row_bytes = ggml_row_bytes(a.type, n);
  a.data.resize(a.row_bytes * static_cast<size_t>(n_rows));
  pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) quantize_row(a.type, x + r * n, a.data.data() + static_cast<size_t>(r) * a.row_bytes, n);
  });
  return a;
}

// The routing of one batch: slot s = t * k + j is token t's j-th chosen expert.
struct Routing {
  int64_t k = 0;
  std::vector<int32_t> expert;                 // [n_tok * k]
  std::vector<float> weight;                   // [n_tok * k]
  std::vector<std::vector<int64_t>> slots_of;  // per expert: the slots routed to it, ascending
};

// y[s][n_out] = (W_e act[s / act_div]) * scale[e] + b[e] for every slot s routed to expert e.
// Jobs are (expert, row tile) pairs, so each expert's matrix is read once per batch.
void expert_matmul(const Experts& x, const Routing& rt, const ActRows& act, int64_t act_div, float* y,
                   ThreadPool& pool) {
  const TensorView& w = *x.w;
  const int64_t n_in = x.n_in(), n_out = x.n_out();
  const int64_t n_tiles = (n_out + kRowTile - 1) / kRowTile;
  std::vector<std::pair<int32_t, int64_t>> jobs;  // (expert, first row)
  for (size_t e = 0; e < rt.slots_of.size(); ++e)
    if (!rt.slots_of[e].empty())
      for (int64_t tile = 0; tile < n_tiles; ++tile) jobs.emplace_back(static_cast<int32_t>(e), tile * kRowTile);
  const size_t w_stride = w.row_bytes();
  pool.parallel_for(static_cast<int64_t>(jobs.size()), [&](int64_t j0, int64_t j1, int) {
    float tmp[kRowTile];
    for (int64_t j = j0; j < j1; ++j) {
      const auto [e, r0] = jobs[static_cast<size_t>(j)];
      const int64_t nr = std::min(kRowTile, n_out - r0);
      const uint8_t* rows = w.row(e * n_out + r0);
      for (int64_t s : rt.slots_of[static_cast<size_t>(e)]) {
        vec_dot_rows(w.type, rows, w_stride, nr, act.row(s / act_div), n_in, tmp);
        float* ys = y + s * n_out + r0;
        const float sc = x.scale ? x.scale[e] : 1.0f;
        const float* b = x.b ? x.b + e * n_out + r0 : nullptr;
        for (int64_t i = 0; i < nr; ++i) {
          float v = tmp[i];
          if (x.scale) v *= sc;
          if (b) v += b[i];
          ys[i] = v;
        }
      }
    }
  });
}

// gate [n][n_ff] <- glu(gate, up), the experts' activation.
void expert_glu(const MoePlan& plan, float* gate, const float* up, int64_t n) {
  if (plan.swiglu_oai) {
    // ggml_swiglu_oai (ggml-cpu ops.cpp): x = min(g, limit), y = clamp(u, -limit, limit),
    // x * sigmoid(alpha x) * (y + 1), with gpt-oss's alpha 1.702 and limit 7.
    constexpr float kAlpha = 1.702f, kLimit = 7.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float x = std::min(gate[i], kLimit);
      const float y = std::clamp(up[i], -kLimit, kLimit);
      gate[i] = x / (1.0f + std::exp(kAlpha * (-x))) * (y + 1.0f);
    }
    return;
  }
  // ggml_swiglu_split: silu(gate) * up
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

Routing route_batch(const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok, ThreadPool& pool) {
  const MoePlan& mp = p.moe;
  Routing rt;
  rt.k = mp.n_expert_used;
  rt.expert.resize(static_cast<size_t>(n_tok * rt.k));
  rt.weight.resize(static_cast<size_t>(n_tok * rt.k));
  // logits = self.gate(hidden_states)
  Buf logits(static_cast<size_t>(n_tok * mp.n_expert));
  linear(w.ffn_gate_inp, h, n_tok, logits.data(), pool);
  for (int64_t t = 0; t < n_tok; ++t)
    route_token(mp, logits.data() + t * mp.n_expert, w.exp_probs_b, rt.expert.data() + t * rt.k,
                rt.weight.data() + t * rt.k);
  rt.slots_of.assign(static_cast<size_t>(mp.n_expert), {});
  for (int64_t s = 0; s < n_tok * rt.k; ++s) rt.slots_of[static_cast<size_t>(rt.expert[static_cast<size_t>(s)])].push_back(s);
  return rt;
}

// The shared expert, added to out: down(silu(gate h) * up h) [* sigmoid(gate_inp_shexp h)].
void shared_expert(const MoePlan& mp, const LayerWeights& w, const float* h, int64_t n_tok, int64_t n_embd,
                   float* out, ThreadPool& pool) {
  const int64_t F = mp.n_ff_shexp;
  Buf g(static_cast<size_t>(n_tok * F)), u(static_cast<size_t>(n_tok * F)), y(static_cast<size_t>(n_tok * n_embd));
  linear(w.ffn_up_shexp, h, n_tok, u.data(), pool);
  linear(w.ffn_gate_shexp, h, n_tok, g.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  linear(w.ffn_down_shexp, g.data(), n_tok, y.data(), pool);
  Buf gate(static_cast<size_t>(n_tok), 1.0f);
  if (mp.shexp_gate) {
    // gate = ffn_gate_inp_shexp . h; llama.cpp (qwen2moe) writes the sigmoid as silu(x) / x.
    for (int64_t t = 0; t < n_tok; ++t) {
      double dot = 0.0;
      for (int64_t i = 0; i < n_embd; ++i) dot += static_cast<double>(w.ffn_gate_inp_shexp[i]) * h[t * n_embd + i];
      const float v = static_cast<float>(dot);
      gate[static_cast<size_t>(t)] = v / (1.0f + std::exp(-v)) / v;
    }
  }
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t i = 0; i < n_embd; ++i) out[t * n_embd + i] += y[static_cast<size_t>(t * n_embd + i)] * gate[static_cast<size_t>(t)];
}

// Group-limited routing (llama.cpp's build_moe_ffn with n_expert_groups > 1, DeepSeek-V3's
// n_group / topk_group): each group of E / n_group consecutive experts scores the sum of its
// two best selection scores; the experts of all but the best n_group_used groups (ties to
// the lower group) get -inf and so are never chosen.
void mask_groups(const MoePlan& mp, float* sel) {
  const int64_t per = mp.n_expert / mp.n_group;
  std::vector<float> gscore(static_cast<size_t>(mp.n_group));
  for (int64_t g = 0; g < mp.n_group; ++g) {
    const float* s = sel + g * per;
    float best = -std::numeric_limits<float>::infinity(), second = best;
    for (int64_t i = 0; i < per; ++i) {
      if (s[i] > best) second = best, best = s[i];
      else if (s[i] > second) second = s[i];
    }
    gscore[static_cast<size_t>(g)] = per > 1 ? best + second : best;
  }
  std::vector<int64_t> order(static_cast<size_t>(mp.n_group));
  for (int64_t g = 0; g < mp.n_group; ++g) order[static_cast<size_t>(g)] = g;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return gscore[static_cast<size_t>(a)] > gscore[static_cast<size_t>(b)]; });
  for (size_t i = static_cast<size_t>(mp.n_group_used); i < order.size(); ++i)
    std::fill(sel + order[i] * per, sel + (order[i] + 1) * per, -std::numeric_limits<float>::infinity());
}

}  // namespace

void route_token(const MoePlan& mp, float* logits, const float* bias, int32_t* chosen, float* weights) {
  const int64_t E = mp.n_expert, k = mp.n_expert_used;
  // probs = softmax(logits) | sigmoid(logits) | logits
  if (mp.gating == ExpertGating::kSoftmax)
    softmax_inplace(logits, E);
  else if (mp.gating == ExpertGating::kSigmoid)
    for (int64_t e = 0; e < E; ++e) logits[e] = sigmoid(logits[e]);
  const float* probs = logits;
  // top-k of probs (+ exp_probs_b): best first, ties to the lower index
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  std::vector<float> sel(static_cast<size_t>(E));  // selection scores: probs (+ exp_probs_b)
  for (int64_t e = 0; e < E; ++e) sel[static_cast<size_t>(e)] = bias ? probs[e] + bias[e] : probs[e];
  if (mp.group_limited()) mask_groups(mp, sel.data());
  auto score = [&](int32_t e) { return sel[static_cast<size_t>(e)]; };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    const float sa = score(a), sb = score(b);
    return sa > sb || (sa == sb && a < b);
  });
  for (int64_t j = 0; j < k; ++j) {
    chosen[j] = order[static_cast<size_t>(j)];
    weights[j] = probs[chosen[j]];
  }
  if (mp.gating == ExpertGating::kSoftmaxWeight) softmax_inplace(weights, k);
  if (mp.norm_w) {
    double sum = 0.0;  // ggml_sum_rows accumulates in ggml_float
    for (int64_t j = 0; j < k; ++j) sum += weights[j];
    const float s = std::max(static_cast<float>(sum), kMinWeightSum);
    for (int64_t j = 0; j < k; ++j) weights[j] /= s;
  }
  if (mp.w_scale != 0.0f && mp.w_scale != 1.0f)
    for (int64_t j = 0; j < k; ++j) weights[j] *= mp.w_scale;
}

void moe_ffn(const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok, int64_t n_embd, float* out,
             ThreadPool& pool) {
  FRINK_ASSERT(p.ffn == FfnKind::kMoe, "moe_ffn on a layer without experts");
  const MoePlan& mp = p.moe;
  const int64_t F = mp.n_ff_exp;
  const Routing rt = route_batch(p, w, h, n_tok, pool);
  const int64_t n_slots = n_tok * rt.k;

  // gate, up = gate_e(x), up_e(x) for each chosen expert e   (or one fused gate_up_e(x), split)
  Buf gate(static_cast<size_t>(n_slots * F)), up(static_cast<size_t>(n_slots * F));
  if (w.ffn_gate_up_exps) {
    Buf gu(static_cast<size_t>(n_slots * 2 * F));
    const ActRows a = convert_rows(w.ffn_gate_up_exps.w->type, h, n_tok, n_embd, pool);
    expert_matmul(w.ffn_gate_up_exps, rt, a, rt.k, gu.data(), pool);
    for (int64_t s = 0; s < n_slots; ++s) {
      const float* row = gu.data() + s * 2 * F;
      std::copy(row, row + F, gate.data() + s * F);
      std::copy(row + F, row + 2 * F, up.data() + s * F);
    }
  } else {
    const ActRows a_up = convert_rows(w.ffn_up_exps.w->type, h, n_tok, n_embd, pool);
    expert_matmul(w.ffn_up_exps, rt, a_up, rt.k, up.data(), pool);
    if (vec_dot_type(w.ffn_gate_exps.w->type) == a_up.type) {
      expert_matmul(w.ffn_gate_exps, rt, a_up, rt.k, gate.data(), pool);
    } else {
      const ActRows a_gate = convert_rows(w.ffn_gate_exps.w->type, h, n_tok, n_embd, pool);
      expert_matmul(w.ffn_gate_exps, rt, a_gate, rt.k, gate.data(), pool);
    }
  }
  expert_glu(mp, gate.data(), up.data(), n_slots * F);

  // y_e = down_e(hidden); out = sum_j weight_j * y_{e_j}, added in the order chosen
  Buf y(static_cast<size_t>(n_slots * n_embd));
  const ActRows a_down = convert_rows(w.ffn_down_exps.w->type, gate.data(), n_slots, F, pool);
  expert_matmul(w.ffn_down_exps, rt, a_down, 1, y.data(), pool);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* o = out + t * n_embd;
    for (int64_t j = 0; j < rt.k; ++j) {
      const int64_t s = t * rt.k + j;
      const float wt = rt.weight[static_cast<size_t>(s)];
      const float* ys = y.data() + s * n_embd;
      if (j == 0)
        for (int64_t i = 0; i < n_embd; ++i) o[i] = ys[i] * wt;
      else
        for (int64_t i = 0; i < n_embd; ++i) o[i] += ys[i] * wt;
    }
  }
  if (mp.n_ff_shexp > 0) shared_expert(mp, w, h, n_tok, n_embd, out, pool);
}

}  // namespace frink::cpu
