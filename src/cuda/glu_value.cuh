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

}  // namespace frink::cuda
