// Device helpers the pick kernels share (pick.cu, pick_exact.cu): candidates as 64-bit keys in
// the host sampler's order, and the draw's arithmetic as the host rounds it (engine
// sampling::finish: sums and walks by chunks of kPickSumChunk candidates).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/pick.cuh"

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

// sums[blockIdx.x] = the block's terms (e, one a thread of kPickSumChunk) added in thread order,
// by thread 0: a chunk's sum. Every thread calls it.
__device__ __forceinline__ void store_chunk_sum(double e, double* sums) {
  __shared__ double s_e[kPickSumChunk];
  s_e[threadIdx.x] = e;
  __syncthreads();
  if (threadIdx.x == 0) sums[blockIdx.x] = sum_in_order(s_e, kPickSumChunk);
}

// The first position where the walk's running mass (the earlier chunks' sums, then the chunk's
// terms up to it) passes `at` (strictly above it where strict, else reaching it), and the mass
// before its chunk: thread 0 finds the chunk from sums (in s_sums), the block the chunk's terms
// (term(i) for the chunk's i < len), thread 0 the position. len where none does.
template <class Term>
__device__ int64_t walk_chunks(const double* s_sums, int chunks, int64_t len, double at, bool strict, Term term) {
  __shared__ int s_c;
  __shared__ double s_before, s_e[kPickSumChunk];
  __shared__ int64_t s_pos;
  const auto passes = [&](double mass) { return strict ? at < mass : mass >= at; };
  if (threadIdx.x == 0) {
    double before = 0;
    int c = 0;
    for (; c < chunks; ++c) {  // no term of a chunk passed here passes `at` (the sums only grow)
      const double next = __dadd_rn(before, s_sums[c]);
      if (passes(next)) break;
      before = next;
    }
    s_c = c;
    s_before = before;
  }
  __syncthreads();
  if (s_c == chunks) return len;
  const int64_t base = static_cast<int64_t>(s_c) * kPickSumChunk;
  const int clen = static_cast<int>(min(int64_t{kPickSumChunk}, len - base));
  if (static_cast<int>(threadIdx.x) < clen) s_e[threadIdx.x] = term(base + threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0;
    int j = 0;
    for (; j < clen - 1; ++j) {
      run = __dadd_rn(run, s_e[j]);
      if (passes(__dadd_rn(s_before, run))) break;
    }
    s_pos = base + j;  // the chunk's sum passed: its last if no earlier
  }
  __syncthreads();
  return s_pos;
}

// A softmax term of the draw: exp(v / temp - vmax / temp), as the host divides (a float each).
__device__ __forceinline__ double temp_term(float v, float vmax, float temp) {
  return exp(static_cast<double>(__fdiv_rn(v, temp)) - static_cast<double>(__fdiv_rn(vmax, temp)));
}

}  // namespace frink::cuda
