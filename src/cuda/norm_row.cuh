// The one-pass vector norm of a row (norm.cu's kernel; act_prep.cu's norm + quantize kernels
// run the same body, so a fused product input equals the plain norm's output bit for bit).
// Only for .cu files.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/norm.cuh"

namespace frink::cuda {

inline constexpr int kNormMaxThreads = 1024;
inline constexpr int kNormVecPer = 4;  // float4 per thread: rows up to 16384

inline bool norm_aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

// Whether rows of p take the vector body: float4-aligned, at most kNormVecPer float4 a thread.
inline bool norm_vec_ok(const NormParams& p) {
  return p.n % 4 == 0 && p.x_stride % 4 == 0 && p.y_stride % 4 == 0 && norm_aligned16(p.x) && norm_aligned16(p.y) &&
         (!p.w || norm_aligned16(p.w)) && (!p.b || norm_aligned16(p.b)) && (!p.residual || norm_aligned16(p.residual)) &&
         p.n <= int64_t{kNormMaxThreads} * kNormVecPer * 4;
}

// Threads for a row of n: enough that kNormVecPer float4 each cover it, a multiple of 64, so a
// fused Q8_K quantization's 256-element blocks never straddle a slab. Every kernel on this
// body uses this one count: the block sums' order, and so the output bits, follow from it.
inline int64_t norm_vec_threads(int64_t n) {
  const int64_t per_thread = (n / 4 + kNormMaxThreads - 1) / kNormMaxThreads;  // 1..kNormVecPer
  const int64_t t = (n / 4 + per_thread - 1) / per_thread;
  return std::clamp<int64_t>((t + 63) / 64 * 64, 64, kNormMaxThreads);
}

#ifdef __CUDACC__
// A float4's sum of squares as the vector norm adds it: one expression for norm_vec_row and
// the q/k/v products' fused QK-norm (matvec.cu), so both contract it to the same FMAs.
__device__ __forceinline__ float sq_sum4(float4 v) { return (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w); }

// Sum over the block (any multiple of 32 threads up to 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row `row` of p normed by the block (threads = norm_vec_threads), written to p.y (Store) and
// left in o: thread i holds elements [4 (i + k blockDim), + 4) in o[k] (zeros past the row).
// Every thread of the block must call it (it synchronises the block).
template <bool Store = true>
__device__ __forceinline__ void norm_vec_row(const NormParams& p, float4 (&o)[kNormVecPer], int64_t row) {
  __shared__ float shared[32];
  const int64_t n4 = p.n / 4;
  const float4* x = reinterpret_cast<const float4*>(p.x + row * p.x_stride);
  float4* y = reinterpret_cast<float4*>(p.y + row * p.y_stride);
  float4 v[kNormVecPer];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    v[k] = i < n4 ? x[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
  }
  float mean = 0.0f;
  if (p.layer_norm) mean = block_sum(s, shared) / static_cast<float>(p.n);
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    if (i >= n4) continue;
    v[k].x -= mean, v[k].y -= mean, v[k].z -= mean, v[k].w -= mean;
    ss += sq_sum4(v[k]);
  }
  const float scale = rsqrtf(block_sum(ss, shared) / static_cast<float>(p.n) + p.eps);
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    o[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i >= n4) continue;
    o[k] = make_float4(v[k].x * scale, v[k].y * scale, v[k].z * scale, v[k].w * scale);
    if (p.w) {
      const float4 w = reinterpret_cast<const float4*>(p.w)[i];
      o[k].x *= w.x, o[k].y *= w.y, o[k].z *= w.z, o[k].w *= w.w;
    }
    if (p.b) {
      const float4 b = reinterpret_cast<const float4*>(p.b)[i];
      o[k].x += b.x, o[k].y += b.y, o[k].z += b.z, o[k].w += b.w;
    }
    if (p.residual) {
      const float4 r = reinterpret_cast<const float4*>(p.residual + row * p.y_stride)[i];
      o[k].x = r.x + o[k].x, o[k].y = r.y + o[k].y, o[k].z = r.z + o[k].z, o[k].w = r.w + o[k].w;
    }
    if constexpr (Store) y[i] = o[k];
  }
}

#endif

}  // namespace frink::cuda
