// The routing of one token by one warp (RouteParams, the host's route_token step for step):
// route_kernel's body, and that of the expert products that route in their own launch
// (MatmulParams::route).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/moe.cuh"

namespace frink::cuda {

inline constexpr int kMaxUsed = 32;               // experts chosen per token, at most
inline constexpr float kMinWeightSum = 6.103515625e-5f;  // llama.cpp's clamp of the weight sum (f16 min normal)

// (selection score, expert) as one 64-bit key whose unsigned order is the host's partial_sort
// order: the larger score first, the lower expert on ties. A warp's argmax in the top-k loop
// is then a max over one 64-bit value per level (two shuffles), where it compared score,
// expert and probability (three shuffles and a branchy select), k times per token. Measured
// with the router's geometry (matvec.cu, kFewRows): qwen3-30b-a3b tg128 graph 2.728 -> 2.645
// ms (H200, one call, alternating). 0 is below every key: no expert.
__device__ __forceinline__ uint64_t rank_key(float s, int e) {
  if (s == 0.0f) s = 0.0f;  // -0 ranks as +0 (equal scores), as in the host's float compare
  uint32_t u = __float_as_uint(s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // IEEE order as unsigned order (no NaN here)
  return (uint64_t{u} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(e));
}

// A shared expert's gate weight, sigmoid(v), as llama.cpp (qwen2moe) writes it: silu(v) / v.
// The routing (a stacked shared expert's slot) and the combine (a separate one) both take it
// from here, so the two paths weigh the shared expert with the same bits.
__device__ __forceinline__ float shared_gate_weight(float v) { return v / (1.0f + expf(-v)) / v; }

// The warp's largest key: the scores' word by one redux.sync, then the expert word among the
// lanes holding that score by another (the key's order: score, then the lower expert), where
// five levels of two 32-bit shuffles and a 64-bit compare each stood.
__device__ __forceinline__ uint64_t warp_max_key(uint64_t key) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto hi = static_cast<uint32_t>(key >> 32), top = __reduce_max_sync(0xffffffffu, hi);
  const uint32_t lo = __reduce_max_sync(0xffffffffu, hi == top ? static_cast<uint32_t>(key) : 0u);
  return (uint64_t{top} << 32) | lo;
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, key, o);
    key = other > key ? other : key;
  }
  return key;
#endif
}

// A lane's keys sorted, the largest first (a bitonic network: compile-time indices, so the
// keys stay in registers).
template <int kPer>
__device__ __forceinline__ void sort_keys_desc(uint64_t (&a)[kPer]) {
  static_assert((kPer & (kPer - 1)) == 0, "a power of two");
#pragma unroll
  for (int size = 2; size <= kPer; size *= 2)
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2)
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0, lt = a[i] < a[j];
          const uint64_t hi = lt ? a[j] : a[i], lo = lt ? a[i] : a[j];
          a[i] = desc ? hi : lo;
          a[j] = desc ? lo : hi;
        }
      }
}

// What route_probs leaves for prob_of: the softmax's max and reciprocal sum.
struct ProbScale {
  float mx = 0.0f, inv = 1.0f;
};

// Expert e's probability from its logit l, the same bits as route_probs gives it (the same
// operations), so the winners' weights need not travel with their keys.
__device__ __forceinline__ float prob_of(const RouteParams& p, float l, ProbScale ps) {
  if (p.gating == 0) return (l == -INFINITY ? 0.0f : expf(l - ps.mx)) * ps.inv;
  if (p.gating == 1) return 1.0f / (1.0f + expf(-l));
  return l;
}

// Token t's probabilities as route_token ranks and weighs them: logit lane + 32 i in prob[i]
// (-inf, then 0 after a softmax, past the experts), softmaxed or sigmoided by gating.
template <int kPer>
__device__ __forceinline__ ProbScale route_probs(const RouteParams& p, const float* lg, int lane, float (&prob)[kPer]) {
  const int E = static_cast<int>(p.n_expert);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    prob[i] = e < E ? lg[e] : -INFINITY;
  }
  ProbScale ps;
  if (p.gating == 0) {
    // softmax_inplace: max, exp (-inf -> 0), sum in double, times the float reciprocal
    float m[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) m[i] = prob[i];
#pragma unroll
    for (int w = 1; w < kPer; w *= 2)  // a tree: the max is exact in any order
#pragma unroll
      for (int i = 0; i + w < kPer; i += 2 * w) m[i] = fmaxf(m[i], m[i + w]);
    float mx = m[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    ps.mx = mx;
    // exp(-inf - mx) is +0 for any finite mx, so only a row of -inf logits needs the host's
    // -inf -> 0 (a select per expert ahead of each exp made the compiler branch around it).
    double sum = 0.0;
    if (mx != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        prob[i] = expf(prob[i] - mx);
        sum += prob[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) prob[i] = 0.0f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    ps.inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] *= ps.inv;
  } else if (p.gating == 1) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] = 1.0f / (1.0f + expf(-prob[i]));
  }
  return ps;
}

// Expert e's selection score (ranks; never weighs).
__device__ __forceinline__ float selection_score(const RouteParams& p, float prob, int e) {
  return p.sel_bias ? prob + p.sel_bias[e] : prob;
}

// Expert e's ranking key of probability prob (0 past the experts: never chosen).
__device__ __forceinline__ uint64_t route_key(const RouteParams& p, float prob, int e) {
  if (e >= p.n_expert) return 0;
  const float s = selection_score(p, prob, e);
  return rank_key(isnan(s) ? -INFINITY : s, e);  // a NaN score still yields a valid expert
}

// Group-limited routing (RouteParams::n_group; the host's mask_groups): each group of
// n_expert / n_group consecutive experts scores the sum of its two best selection scores, and
// the experts of all but the best n_group_used groups (ties to the lower group) rank as -inf.
// Lane g ends holding group g's score; the top two of a group meet by max and min, which are
// exact in any order, so the sum is the host's.
template <int kPer>
__device__ __forceinline__ void mask_groups(const RouteParams& p, const float (&prob)[kPer], uint64_t (&key)[kPer],
                                            int lane) {
  const int E = static_cast<int>(p.n_expert), per = E / p.n_group;
  float gscore = -INFINITY;
  for (int g = 0; g < p.n_group; ++g) {
    float best = -INFINITY, second = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e >= E || e / per != g) continue;
      const float s = selection_score(p, prob[i], e);
      if (s > best) {
        second = best;
        best = s;
      } else if (s > second) {
        second = s;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float b2 = __shfl_xor_sync(0xffffffffu, best, o), s2 = __shfl_xor_sync(0xffffffffu, second, o);
      second = fmaxf(fminf(best, b2), fmaxf(second, s2));
      best = fmaxf(best, b2);
    }
    if (lane == g) gscore = per > 1 ? best + second : best;
  }
  int before = 0;  // groups ranked before lane's group
  for (int j = 0; j < p.n_group; ++j) {
    const float gj = __shfl_sync(0xffffffffu, gscore, j);
    before += gj > gscore || (gj == gscore && j < lane);
  }
  const unsigned kept = __ballot_sync(0xffffffffu, lane < p.n_group && before < p.n_group_used);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E && !((kept >> (e / per)) & 1u)) key[i] = rank_key(-INFINITY, e);
  }
}

// A double sum of lane j's v over lanes j < k, in j's order (the host's sequential sum), the
// same in every lane.
__device__ __forceinline__ double lanes_sum_in_order(float v, int k) {
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, v, j);
  return sum;
}

// One warp routes token t, kPer experts a lane. slot_out (may be null): the token's k + n_shared
// slot experts go there (lane j writes slot j); store: they and their weights go to p.expert and
// p.weight. Each top-k round takes the warp's largest key (two redux) and its owner drops it;
// lane j keeps round j's expert, so the end (the chosen's softmax, the weights' normalization,
// the stores) runs a slot a lane. Why: the end on lane 0 alone, walking arrays in local memory,
// took 1.0-1.5 us of a 3-5.5 us routing (tools/route_latency.cu, H200).
template <int kPer>
__device__ __forceinline__ void route_token(const RouteParams& p, int64_t t, int32_t* slot_out, bool store) {
  const int lane = threadIdx.x % 32, E = static_cast<int>(p.n_expert), k = static_cast<int>(p.k);
  const float* lg = p.logits + t * (p.n_expert + p.shared_gated);
  float prob[kPer];
  const ProbScale ps = route_probs<kPer>(p, lg, lane, prob);
  uint64_t key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) key[i] = route_key(p, prob[i], lane + 32 * i);
  if (p.n_group > 1) mask_groups<kPer>(p, prob, key, lane);
  sort_keys_desc<kPer>(key);
  int mine = 0;  // lane j: round j's expert
  for (int j = 0; j < k; ++j) {
    const uint64_t best = warp_max_key(key[0]);
    const int be = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(best));
    if (lane == j) mine = be;
    const bool won = key[0] == best;  // keys are unique: one lane pops its head
#pragma unroll
    for (int i = 0; i + 1 < kPer; ++i) key[i] = won ? key[i + 1] : key[i];
    key[kPer - 1] = won ? 0 : key[kPer - 1];
  }
  const int slots = k + p.n_shared;
  if (slot_out) {
    if (lane < k) slot_out[lane] = mine;
    if (lane >= k && lane < slots) slot_out[lane] = E + lane - k;
  }
  if (!store) return;
  float w = lane < k ? prob_of(p, lg[mine], ps) : 0.0f;
  if (p.gating == 2) {  // softmax over the chosen (softmax_inplace again)
    float mx = lane < k ? w : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    w = w == -INFINITY ? 0.0f : expf(w - mx);
    w *= static_cast<float>(1.0 / lanes_sum_in_order(w, k));
  }
  if (p.norm_w) w /= fmaxf(static_cast<float>(lanes_sum_in_order(w, k)), kMinWeightSum);  // ggml_sum_rows: a ggml_float sum
  if (p.w_scale != 0.0f && p.w_scale != 1.0f) w *= p.w_scale;
  if (lane < k) {
    p.expert[t * slots + lane] = mine;
    p.weight[t * slots + lane] = w;
  } else if (lane < slots) {
    p.expert[t * slots + lane] = E + lane - k;
    p.weight[t * slots + lane] = p.shared_gated ? shared_gate_weight(lg[E]) : 1.0f;
  }
}

}  // namespace frink::cuda
