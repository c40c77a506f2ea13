// Device helpers the pick kernels share (pick.cu, pick_exact.cu): candidates as 64-bit keys in
// the host sampler's order, and the draw's arithmetic as the host rounds it.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

// A candidate as one 64-bit key whose descending order is sampling::top_k's: the value's bits
// made monotonic above (value_ord), 0xffffffff - id below (the lower id first on equal values).
// Keys are distinct; 0 is "nothing", below every real entry (-inf included). -0 is +0, as the
// host's order compares them.
__device__ __forceinline__ uint32_t value_ord(float v) {
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float ord_value(uint32_t ord) {
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}
__device__ __forceinline__ uint64_t cand_key(float v, int64_t id) {
  return (static_cast<uint64_t>(value_ord(v)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ float key_value(uint64_t key) { return ord_value(static_cast<uint32_t>(key >> 32)); }
__device__ __forceinline__ int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// s[0] + s[1] + ... + s[n - 1] in that order (thread 0; s in shared memory): unrolled so the
// loads run ahead of the chain of adds. Over 501 chunk sums read from global memory one at a
// time it cost about 40 us a token (8B, H200: a whole-vocabulary draw 1.938 ms of graph against
// 1.895 for top-k 40).
__device__ __forceinline__ double sum_in_order(const double* s, int n) {
  double sum = 0;
#pragma unroll 16
  for (int i = 0; i < n; ++i) sum = __dadd_rn(sum, s[i]);
  return sum;
}

// A softmax term of the draw: exp(v / temp - vmax / temp), as the host divides (a float each).
__device__ __forceinline__ double temp_term(float v, float vmax, float temp) {
  return exp(static_cast<double>(__fdiv_rn(v, temp)) - static_cast<double>(__fdiv_rn(vmax, temp)));
}

}  // namespace frink::cuda
