// The host's Q8_K quantization rule (quantize_row_q8_K), written once for every kernel that
// writes Q8_K activation blocks (act_prep.cu's quantize and fused-norm kernels, attention.cu's
// merge): a product's input quantized by any of them must be the same bits. Only for .cu files.
#pragma once

#include <climits>
#include <cstdint>

namespace frink::cuda {

// For a 256-block whose first value of largest magnitude is mx (amax = |mx|; 0 for an
// all-zero block, whose quants and scale are 0).
__device__ __forceinline__ float q8k_iscale(float amax, float mx) { return amax == 0.0f ? 0.0f : -127.f / mx; }
__device__ __forceinline__ float q8k_quant_f(float v, float amax, float iscale) {
  return amax == 0.0f ? 0.0f : fminf(127.0f, rintf(iscale * v));
}
__device__ __forceinline__ int q8k_quant(float v, float amax, float iscale) {
  return static_cast<int>(q8k_quant_f(v, amax, iscale));
}
__device__ __forceinline__ float q8k_scale(float amax, float iscale) { return amax == 0.0f ? 0.0f : 1 / iscale; }

// The scale rule across candidates (magnitude amax, signed value mx, element index idx): the
// larger magnitude wins, on a tie the lower index (the host's first element of largest
// magnitude). take_first_max folds one more candidate in; warp_first_max reduces the warp.
__device__ __forceinline__ void take_first_max(float a2, float m2, int i2, float& amax, float& mx, int& idx) {
  if (a2 > amax || (a2 == amax && i2 < idx)) {
    amax = a2;
    mx = m2;
    idx = i2;
  }
}
__device__ __forceinline__ void warp_first_max(float& amax, float& mx, int& idx) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    take_first_max(__shfl_xor_sync(0xffffffffu, amax, off), __shfl_xor_sync(0xffffffffu, mx, off),
                   __shfl_xor_sync(0xffffffffu, idx, off), amax, mx, idx);
}

__device__ __forceinline__ int warp_isum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One 256-block held by threads [0, 256) of a thread block, thread i holding element i:
// thread i's quant, its warp's sub-block (32) sum, and the block's scale. Threads from 256 on
// (a larger block) take part in the barrier only; their results mean nothing. Every thread of
// the block must call it (one __syncthreads), at most once per barrier-separated phase of sh.
struct Q8KShared {
  float amax[8], mx[8];
  int idx[8];
};
struct Q8KElem {
  int q, sum;
  float d;
};
__device__ __forceinline__ Q8KElem q8k_block_256(float v, Q8KShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // The host's strict '>' scan from 0, one element per thread.
  float amax = 0.0f, mx = 0.0f;
  int idx = INT_MAX;
  if (fabsf(v) > amax) {
    amax = fabsf(v);
    mx = v;
    idx = static_cast<int>(threadIdx.x);
  }
  warp_first_max(amax, mx, idx);
  if (lane == 0 && warp < 8) {
    sh.amax[warp] = amax;
    sh.mx[warp] = mx;
    sh.idx[warp] = idx;
  }
  __syncthreads();
  amax = sh.amax[0];
  mx = sh.mx[0];
  idx = sh.idx[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) take_first_max(sh.amax[w], sh.mx[w], sh.idx[w], amax, mx, idx);
  const float iscale = q8k_iscale(amax, mx);
  const int q = q8k_quant(v, amax, iscale);
  return {q, warp_isum(q), q8k_scale(amax, iscale)};
}

}  // namespace frink::cuda
