// The host's Q8_0 quantization rule (quantize_row_q8_0), written once for every kernel that
// writes Q8_0 activation blocks (act_prep.cu's quantize and fused kernels, attention.cu's
// merge): a product's input quantized by any of them must be the same bits. Only for .cu files.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace frink::cuda {

// For a 32-block of largest magnitude amax: quant = roundf(x * inv), scale kept = d (rounded
// to f16).
struct Q8Rule {
  float inv, d;
};
__device__ __forceinline__ Q8Rule q8_0_rule(float amax) {
  const float d = amax / 127;
  return {d != 0.0f ? 1.0f / d : 0.0f, __half2float(__float2half_rn(d))};
}

// One Q8_0 block held by a full warp, lane j holding element j: lane j's quant, and the
// block's scale (every lane gets it; one lane stores it).
struct Q8Elem {
  int8_t q;
  float d;
};
// raw_d: the scale as amax / 127 before its f16 rounding (a NormFold's: its readers round it
// once 1/rms has scaled it, as the host rounds the normed row's).
__device__ __forceinline__ Q8Elem q8_0_warp_block(float v, bool raw_d = false) {
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const Q8Rule r = q8_0_rule(amax);
  return {static_cast<int8_t>(roundf(v * r.inv)), raw_d ? amax / 127 : r.d};
}

}  // namespace frink::cuda
