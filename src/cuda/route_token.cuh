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

// The largest of a lane's keys, as a tree: the linear scan was a chain of kPer dependent
// 64-bit selects per top-k step (16 of them for a 512-expert router).
template <int kPer>
__device__ __forceinline__ uint64_t lane_max_key(const uint64_t (&key)[kPer]) {
  uint64_t m[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) m[i] = key[i];
#pragma unroll
  for (int w = 1; w < kPer; w *= 2)
#pragma unroll
    for (int i = 0; i + w < kPer; i += 2 * w) m[i] = m[i + w] > m[i] ? m[i + w] : m[i];
  return m[0];
}

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

// One warp routes token t, kPer experts a lane. slot_out (may be null): lane 0 writes the
// token's k (+ shared) slot experts there; store: lane 0 writes them and their weights to p.expert and p.weight.
template <int kPer>
__device__ __forceinline__ void route_token(const RouteParams& p, int64_t t, int32_t* slot_out, bool store) {
  const int lane = threadIdx.x % 32;
  const int E = static_cast<int>(p.n_expert);
  const float* lg = p.logits + t * (p.n_expert + (p.shared == 2));
  float prob[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    prob[i] = e < E ? lg[e] : -INFINITY;
  }
  if (p.gating == 0) {
    // softmax_inplace: max, exp (-inf -> 0), sum in double, times the float reciprocal
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) mx = fmaxf(mx, prob[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      prob[i] = prob[i] == -INFINITY ? 0.0f : expf(prob[i] - mx);
      sum += prob[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] *= inv;
  } else if (p.gating == 1) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] = 1.0f / (1.0f + expf(-prob[i]));
  }
  uint64_t key[kPer];  // 0 for lanes past the experts: never chosen
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      const float s = p.sel_bias ? prob[i] + p.sel_bias[e] : prob[i];
      key[i] = rank_key(isnan(s) ? -INFINITY : s, e);  // a NaN score still yields a valid expert
    } else {
      key[i] = 0;
    }
  }
  float w[kMaxUsed];
  int chosen[kMaxUsed];
  const int k = static_cast<int>(p.k);
  for (int j = 0; j < k; ++j) {
    const uint64_t best = warp_max_key(lane_max_key(key));
    const int be = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(best));
    float mine = 0.0f;  // the winner's lane holds its probability
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) {
        mine = prob[i];
        key[i] = 0;
      }
    chosen[j] = be;
    w[j] = __shfl_sync(0xffffffffu, mine, be % 32);
  }
  if (lane != 0) return;
  if (slot_out) {
    for (int j = 0; j < k; ++j) slot_out[j] = chosen[j];
    if (p.shared) slot_out[k] = E;
  }
  if (!store) return;
  if (p.gating == 2) {  // softmax over the chosen (softmax_inplace again)
    float mx = -INFINITY;
    for (int j = 0; j < k; ++j) mx = fmaxf(mx, w[j]);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      w[j] = w[j] == -INFINITY ? 0.0f : expf(w[j] - mx);
      sum += w[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < k; ++j) w[j] *= inv;
  }
  if (p.norm_w) {
    double sum = 0.0;  // ggml_sum_rows accumulates in ggml_float
    for (int j = 0; j < k; ++j) sum += w[j];
    const float s = fmaxf(static_cast<float>(sum), kMinWeightSum);
    for (int j = 0; j < k; ++j) w[j] /= s;
  }
  if (p.w_scale != 0.0f && p.w_scale != 1.0f)
    for (int j = 0; j < k; ++j) w[j] *= p.w_scale;
  const int64_t slots = k + (p.shared != 0);
  for (int j = 0; j < k; ++j) {
    p.expert[t * slots + j] = chosen[j];
    p.weight[t * slots + j] = w[j];
  }
  if (p.shared) {
    p.expert[t * slots + k] = E;
    p.weight[t * slots + k] = p.shared == 2 ? shared_gate_weight(lg[E]) : 1.0f;
  }
}

}  // namespace frink::cuda
