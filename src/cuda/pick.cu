// Penalties and top-k next to the logits (see pick.cuh).
#include "cuda/pick.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/pdl.cuh"

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
  grid_dependents_launch();  // the draw may launch now and read its parameters, then wait
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

// sampling::finish on the sorted top k: top-p and the draw's sums by thread 0 in candidate
// order (double, rounded one operation at a time), the exps and divisions in parallel.
__global__ void __launch_bounds__(kThreads) draw_kernel(const int32_t* ids, const float* vals, int k, const DrawDev* dp,
                                                       int32_t* out, int32_t* advance) {
  __shared__ float s_v[kPickMaxTopK];
  __shared__ double s_e[kPickMaxTopK];
  __shared__ int s_n;
  const DrawDev d = *dp;  // host memory written before the launch: nothing before this kernel writes it
  grid_dependency_wait();
  const int t = threadIdx.x;
  if (t < k) s_v[t] = vals[t];
  __syncthreads();
  int n = k;
  if (d.top_p < 1.0f) {  // sampling::top_p: softmax at temperature 1; the list is sorted, s_v[0] its max
    if (t < n) s_e[t] = exp(static_cast<double>(s_v[t]) - static_cast<double>(s_v[0]));
    __syncthreads();
    if (t == 0) {
      double total = 0, cum = 0;
      for (int i = 0; i < n; ++i) total = __dadd_rn(total, s_e[i]);
      int keep = n;  // rounding left the sum just below p: keep all
      for (int i = 0; i < n; ++i) {
        cum = __dadd_rn(cum, __ddiv_rn(s_e[i], total));
        if (cum >= d.top_p) {
          keep = i + 1;
          break;
        }
      }
      s_n = keep;
    }
    __syncthreads();
    n = s_n;
  }
  if (d.min_p > 0.0f) {  // sampling::min_p: sorted, so the kept ones are a prefix; at least the first
    const float min_logit = __fadd_rn(s_v[0], d.log_min_p);
    n = max(1, __syncthreads_count(t < n && s_v[t] >= min_logit));
  }
  if (t < n) s_v[t] = __fdiv_rn(s_v[t], d.temp);  // dividing by temp > 0 keeps s_v[0] the max
  __syncthreads();
  if (t < n) s_e[t] = exp(static_cast<double>(s_v[t]) - static_cast<double>(s_v[0]));
  __syncthreads();
  if (t == 0) {
    double total = 0, cum = 0;
    for (int i = 0; i < n; ++i) total = __dadd_rn(total, s_e[i]);
    const double at = __dmul_rn(d.u, total);
    int32_t id = ids[n - 1];  // the last takes any rounding remainder
    for (int i = 0; i < n; ++i) {
      cum = __dadd_rn(cum, s_e[i]);
      if (at < cum) {
        id = ids[i];
        break;
      }
    }
    *out = id;
    if (advance) ++*advance;
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

void launch_draw(const int32_t* ids, const float* vals, int k, const DrawDev* d, int32_t* out, cudaStream_t stream,
                 int32_t* advance) {
  FRINK_CUDA_CHECK(k >= 1 && k <= kPickMaxTopK ? cudaSuccess : cudaErrorInvalidValue);
  static_assert(kPickMaxTopK <= kThreads, "a thread a candidate");
  launch_dependent(draw_kernel, 1, kThreads, 0, stream, ids, vals, k, d, out, advance);
}

}  // namespace frink::cuda
