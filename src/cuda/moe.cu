// Mixture-of-experts routing and combination on the device (see moe.cuh).
#include "cuda/moe.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

constexpr int kMaxUsed = 32;               // experts chosen per token, at most
constexpr float kMinWeightSum = 6.103515625e-5f;  // llama.cpp's clamp of the weight sum (f16 min normal)

// (selection score, expert, probability): the larger score wins, the lower expert on ties
// (the host's partial_sort order).
__device__ __forceinline__ void better(float& s, int& e, float& pr, float s2, int e2, float p2) {
  if (s2 > s || (s2 == s && e2 < e)) {
    s = s2;
    e = e2;
    pr = p2;
  }
}

// kPer experts per lane: the launch picks the fewest that hold n_expert (a 128-expert router
// walked 16 slots per lane, 12 of them empty, in every loop of the top-k).
template <int kPer>
__global__ void route_kernel(RouteParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t t = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (t >= p.n_tok) return;
  const int E = static_cast<int>(p.n_expert);
  const float* lg = p.logits + t * p.n_expert;
  float prob[kPer], sel[kPer];
  bool taken[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    prob[i] = e < E ? lg[e] : -INFINITY;
    taken[i] = e >= E;  // lanes past the experts never compete
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
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    const float s = e < E ? (p.sel_bias ? prob[i] + p.sel_bias[e] : prob[i]) : -INFINITY;
    sel[i] = isnan(s) ? -INFINITY : s;  // a NaN score still yields a valid expert id, never INT_MAX
  }
  float w[kMaxUsed];
  int chosen[kMaxUsed];
  const int k = static_cast<int>(p.k);
  for (int j = 0; j < k; ++j) {
    float bs = -INFINITY, bp = 0.0f;
    int be = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (!taken[i]) better(bs, be, bp, sel[i], lane + 32 * i, prob[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      better(bs, be, bp, __shfl_xor_sync(0xffffffffu, bs, o), __shfl_xor_sync(0xffffffffu, be, o),
             __shfl_xor_sync(0xffffffffu, bp, o));
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) taken[i] = true;
    chosen[j] = be;
    w[j] = bp;
  }
  if (lane != 0) return;
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
  for (int j = 0; j < k; ++j) {
    p.expert[t * k + j] = chosen[j];
    p.weight[t * k + j] = w[j];
  }
}

__global__ void combine_kernel(CombineParams p) {
  const int64_t n = p.n_tok * p.n_embd;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.n_embd, d = i % p.n_embd;
    const float* w = p.weight + t * p.k;
    const float* y = p.y + t * p.k * p.n_embd + d;
    float o = y[0] * w[0];
    for (int64_t j = 1; j < p.k; ++j) o += y[j * p.n_embd] * w[j];
    if (p.shared) {
      float g = 1.0f;
      if (p.shared_gate) {  // llama.cpp (qwen2moe) writes the sigmoid as silu(v) / v
        const float v = p.shared_gate[t];
        g = v / (1.0f + expf(-v)) / v;
      }
      o += p.shared[i] * g;
    }
    p.out[i] = p.residual ? p.residual[i] + o : o;
  }
}

}  // namespace

void launch_route(const RouteParams& p) {
  FRINK_CUDA_CHECK(p.n_expert > 0 && p.n_expert <= kMoeMaxExperts && p.k > 0 && p.k <= kMaxUsed &&
                           p.k <= p.n_expert && p.gating >= 0 && p.gating <= 2
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const int64_t threads = p.n_tok * 32;
  const auto grid = static_cast<unsigned>((threads + 127) / 128);
  static_assert(kMoeMaxExperts == 16 * 32, "route_kernel<16> holds the most experts");
  if (p.n_expert <= 4 * 32) route_kernel<4><<<grid, 128, 0, p.stream>>>(p);
  else if (p.n_expert <= 8 * 32) route_kernel<8><<<grid, 128, 0, p.stream>>>(p);
  else route_kernel<16><<<grid, 128, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const CombineParams& p) {
  const int64_t n = p.n_tok * p.n_embd;
  if (n == 0) return;
  combine_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
