// One RoPE pair's angle and rotation on the device: rope.cu's kernels and the q/k/v products'
// fused store (matvec.cu, MatmulParams::rope) both call these, ONE copy of the arithmetic, so
// the fused path writes the rope kernel's bits. The angle is built exactly as the host (and
// ggml's rope_cache_init) builds it: theta = pos, multiplied by theta_scale once per earlier
// pair in float, so device and host angles round identically (a direct pow() differs by enough
// ulps to move sin/cos at positions in the thousands). Where a product meets a sum, the
// roundings are spelled out (__fmul_rn, __fmaf_rn): left to the compiler, a mul and an add may
// be fused into one fma in one kernel and not in another, and the two paths would differ.
#pragma once

#include <cstdint>

#include "cuda/rope.cuh"

namespace frink::cuda {

__device__ __forceinline__ float yarn_ramp(float low, float high, int i0) {
  const float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// cos and sin of pair `pair`'s angle at position pos, both times YaRN's mscale.
__device__ __forceinline__ float2 rope_cos_sin(const RopeFreq& f, int64_t pos, int64_t pair) {
  float theta_base = static_cast<float>(pos);
  for (int64_t k = 0; k < pair; ++k) theta_base *= f.theta_scale;
  const float ff = f.freq_factors ? f.freq_factors[pair] : 1.0f;
  const float theta_extrap = theta_base / ff;
  const float theta_interp = f.freq_scale * theta_extrap;
  float theta = theta_interp, mscale = f.attn_factor;
  if (f.ext_factor != 0.0f) {
    const float mix = __fmul_rn(yarn_ramp(f.corr0, f.corr1, static_cast<int>(2 * pair)), f.ext_factor);
    theta = __fmaf_rn(theta_extrap, mix, __fmul_rn(theta_interp, __fsub_rn(1.0f, mix)));
    mscale *= __fmaf_rn(0.1f, logf(1.0f / f.freq_scale), 1.0f);
  }
  return make_float2(cosf(theta) * mscale, sinf(theta) * mscale);
}

// The pair (x0, x1) rotated by cs = rope_cos_sin(...).
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float2 cs) {
  return make_float2(__fmaf_rn(-x1, cs.y, __fmul_rn(x0, cs.x)), __fmaf_rn(x1, cs.x, __fmul_rn(x0, cs.y)));
}

}  // namespace frink::cuda
