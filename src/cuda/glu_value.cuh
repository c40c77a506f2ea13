// One element of a gated activation (GluParams), shared by the GLU kernel and the kernel that
// quantizes the down product's input as it computes it (act_prep.cu), so both give the same
// bits. Only for .cu files.
#pragma once

#include <cstdint>

#include "cuda/elementwise.cuh"

namespace frink::cuda {

// SiLU, or GELU's tanh form (the host's silu_inplace / gelu_tanh_inplace).
__device__ __forceinline__ float glu_act(float v, bool gelu) {
  if (!gelu) return v / (1.0f + expf(-v));
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * v * (1.0f + 0.044715f * v * v)));
}

// out[t][j] of p.
__device__ __forceinline__ float glu_value(const GluParams& p, int64_t t, int64_t j) {
  if (p.oai) {
    // ggml_swiglu_oai (the host's expert_glu): x = min(g, 7), y = clamp(u, -7, 7),
    // x * sigmoid(1.702 x) * (y + 1)
    constexpr float kAlpha = 1.702f, kLimit = 7.0f;
    const float x = fminf(p.gate[t * p.gate_stride + j], kLimit);
    const float y = fminf(fmaxf(p.up[t * p.up_stride + j], -kLimit), kLimit);
    return x / (1.0f + expf(kAlpha * (-x))) * (y + 1.0f);
  }
  const float g = glu_act(p.gate[t * p.gate_stride + j], p.gelu);
  return p.up ? g * p.up[t * p.up_stride + j] : g;
}

// The GLU with its up norm (GluParams::up_norm_w): thread i of a 256-thread block holds element
// e of token t, e = 256 b + i. Every thread of the block must call it (it synchronises).
// The group's sum of squares is taken in one fixed order (quads of lanes, then one warp's xor
// tree over the group's quads, through shared memory), so every launch that computes it (the
// plain GLU kernel and the producers that quantize as they go) gives the same bits.
__device__ __forceinline__ float glu_norm_value(const GluParams& p, int64_t t, int64_t e) {
  __shared__ float quads[64];  // 256 elements: 64 quad sums
  __shared__ float totals[8];  // a group's total, by group (at most 8 groups of 32)
  const int lane = threadIdx.x % 32, i = threadIdx.x, gn = static_cast<int>(p.up_norm_n);
  const float u = p.up[t * p.up_stride + e];
  float q = u * u;
  q += __shfl_xor_sync(0xffffffffu, q, 1);
  q += __shfl_xor_sync(0xffffffffu, q, 2);
  if (lane % 4 == 0) quads[i / 4] = q;
  __syncthreads();
  const int per = gn / 4, w = i / 32;  // quads a group: 8, 16, 32 or 64
  if (w < 256 / gn) {                   // warp w sums group w's quads
    float s = lane < per ? quads[w * per + lane] : 0.0f;
    if (lane + 32 < per) s += quads[w * per + lane + 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) totals[w] = s;
  }
  __syncthreads();
  const float scale = rsqrtf(totals[i / gn] / static_cast<float>(gn) + p.up_norm_eps);
  const float y = u * scale * p.up_norm_w[e % gn];
  return glu_act(p.gate[t * p.gate_stride + e], p.gelu) * y;
}

}  // namespace frink::cuda
