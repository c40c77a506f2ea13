// Penalties and top-k next to the logits (see pick.cuh).
#include "cuda/pick.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;          // values per pass-1 block (4 per thread)
constexpr int kMaxLists = 4 * kThreads;  // pass-1 blocks pass 2 can merge (n <= 1M)

__global__ void penalties_kernel(float* logits, const PickDev* p) {
  const int n = p->n_pen;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t id = p->pen[2 * i], count = p->pen[2 * i + 1];
    float l = logits[id];
    // sampling::penalized, each operation rounded on its own (the host builds it unfused)
    l = l <= 0.0f ? __fmul_rn(l, p->repeat) : __fdiv_rn(l, p->repeat);
    l = __fsub_rn(l, __fadd_rn(__fmul_rn(static_cast<float>(count), p->frequency), p->presence));
    logits[id] = l;
  }
}

// (value, index, tag): the larger value wins, the lower index on equal values; (-inf,
// INT_MAX) is "nothing", which any real entry (a real -inf too) beats.
struct Cand {
  float v;
  int32_t i;
  int32_t tag;
};

__device__ __forceinline__ void better(Cand& a, const Cand& b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) a = b;
}

// The block's best candidate, in every thread.
__device__ Cand block_best(Cand c) {
  __shared__ Cand s_c[kThreads / 32];
  __shared__ Cand s_best;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Cand d{__shfl_xor_sync(0xffffffffu, c.v, o), __shfl_xor_sync(0xffffffffu, c.i, o),
           __shfl_xor_sync(0xffffffffu, c.tag, o)};
    better(c, d);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_c[warp] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    Cand b = s_c[0];
    for (int w = 1; w < kThreads / 32; ++w) better(b, s_c[w]);
    s_best = b;
  }
  __syncthreads();
  const Cand b = s_best;
  __syncthreads();  // s_best and s_c may be written again by the next call
  return b;
}

// Pass 1: block b keeps the k best of x[b * kChunk, ...), sorted, in vals/ids[b * k + r].
__global__ void __launch_bounds__(kThreads) topk_chunk_kernel(const float* x, int64_t n, int k, float* vals,
                                                             int32_t* ids) {
  __shared__ float s_v[kChunk];
  __shared__ bool s_taken[kChunk];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int cnt = static_cast<int>(min(static_cast<int64_t>(kChunk), n - base));
  for (int j = threadIdx.x; j < kChunk; j += kThreads) {
    s_v[j] = j < cnt ? x[base + j] : -INFINITY;
    s_taken[j] = j >= cnt;
  }
  __syncthreads();
  for (int r = 0; r < k; ++r) {
    Cand c{-INFINITY, INT_MAX, 0};
    for (int j = threadIdx.x; j < kChunk; j += kThreads)
      if (!s_taken[j]) better(c, Cand{s_v[j], static_cast<int32_t>(base + j), j});
    const Cand b = block_best(c);
    if (threadIdx.x == 0) {
      vals[static_cast<int64_t>(blockIdx.x) * k + r] = b.v;
      ids[static_cast<int64_t>(blockIdx.x) * k + r] = b.i;
      if (b.i != INT_MAX) s_taken[b.tag] = true;
    }
    __syncthreads();
  }
}

// Pass 2: one block merges n_lists sorted lists of k (thread t owns lists t, t + 256, ...).
__global__ void __launch_bounds__(kThreads) topk_merge_kernel(const float* vals, const int32_t* ids, int n_lists,
                                                             int k, int32_t* out_ids, float* out_vals) {
  int head[kMaxLists / kThreads];
#pragma unroll
  for (int q = 0; q < kMaxLists / kThreads; ++q) head[q] = 0;
  for (int r = 0; r < k; ++r) {
    Cand c{-INFINITY, INT_MAX, -1};
#pragma unroll
    for (int q = 0; q < kMaxLists / kThreads; ++q) {
      const int list = threadIdx.x + kThreads * q;
      if (list < n_lists && head[q] < k) {
        const int64_t at = static_cast<int64_t>(list) * k + head[q];
        if (ids[at] != INT_MAX) better(c, Cand{vals[at], ids[at], list});
      }
    }
    const Cand b = block_best(c);
    if (b.tag >= 0 && b.tag % kThreads == static_cast<int>(threadIdx.x)) ++head[b.tag / kThreads];
    if (threadIdx.x == 0) {
      out_ids[r] = b.i;
      out_vals[r] = b.v;
    }
  }
}

}  // namespace

void launch_penalties(float* logits, const PickDev* pick, cudaStream_t stream) {
  penalties_kernel<<<kPickMaxPenalties / kThreads, kThreads, 0, stream>>>(logits, pick);
  FRINK_CUDA_CHECK_LAUNCH();
}

size_t topk_scratch_bytes(int64_t n, int k) {
  return static_cast<size_t>((n + kChunk - 1) / kChunk) * static_cast<size_t>(k) * (sizeof(float) + sizeof(int32_t));
}

void launch_topk(const float* x, int64_t n, int k, void* scratch, int32_t* out_ids, float* out_vals,
                 cudaStream_t stream) {
  const int64_t n_lists = (n + kChunk - 1) / kChunk;
  FRINK_CUDA_CHECK(k >= 1 && k <= kPickMaxTopK && k < n && n_lists <= kMaxLists ? cudaSuccess
                                                                                : cudaErrorInvalidValue);
  float* vals = static_cast<float*>(scratch);
  int32_t* ids = reinterpret_cast<int32_t*>(vals + n_lists * k);
  topk_chunk_kernel<<<static_cast<unsigned>(n_lists), kThreads, 0, stream>>>(x, n, k, vals, ids);
  FRINK_CUDA_CHECK_LAUNCH();
  topk_merge_kernel<<<1, kThreads, 0, stream>>>(vals, ids, static_cast<int>(n_lists), k, out_ids, out_vals);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
