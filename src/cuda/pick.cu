// Penalties and top-k next to the logits (see pick.cuh).
#include "cuda/pick.cuh"

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/pdl.cuh"

namespace frink::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 512;     // the first passes' grid: its blocks' best bound the k-th best (>= kPickMaxTopK)
constexpr int kSortThreads = 1024;
constexpr int kCandCap = 2048;   // candidates the last pass sorts in shared memory (16 KB)

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

// A candidate as one 64-bit key whose descending order is sampling::top_k's: the value's bits
// made monotonic above, 0xffffffff - id below (the lower id first on equal values). Keys are
// distinct; 0 is "nothing", below every real entry (-inf included).
__device__ __forceinline__ uint64_t cand_key(float v, int64_t id) {
  const uint32_t b = __float_as_uint(v);
  const uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ float key_value(uint64_t key) {
  const uint32_t ord = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}
__device__ __forceinline__ int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}
__device__ __forceinline__ uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }

// The block's largest key, in every thread (blockDim.x a multiple of 32, at most 1024).
__device__ uint64_t block_max_key(uint64_t v) {
  __shared__ uint64_t s_w[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max_key(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) s_w[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) v = max_key(v, s_w[w]);
  __syncthreads();  // s_w may be written again by the next call
  return v;
}

// s[0, n) (n a power of two) sorted descending by the block: a bitonic network.
__device__ void sort_desc_keys(uint64_t* s, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = ((i & ~(stride - 1)) << 1) | (i & (stride - 1)), hi = lo + stride;
        const uint64_t a = s[lo], b = s[hi];
        if ((lo & size) == 0 ? a < b : a > b) {  // the last merge (size == n) is descending
          s[lo] = b;
          s[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Why three passes: the first form (k rounds of a block-wide argmax in each of 126 blocks,
// then k rounds merging their lists in one block) cost 73 us a token over the argmax at k 40
// (8B Q4_0, H200), and a bitonic sort of 4096 candidates a block was slower still (one SM's
// instruction rate). This one: 1.954 -> 1.906 ms a token at k 40 (greedy 1.880), 2.333 ->
// 1.934 at k 256.
struct TopkScratch {
  uint64_t block_max[kBlocks];
  unsigned long long count;
  uint64_t cand[kCandCap];
};

// Pass 1: block b's largest key of its chunk of x. The k-th largest of these bounds the
// k-th best of all from below: k blocks hold a key at least that large.
__global__ void __launch_bounds__(kThreads) topk_max_kernel(const float* x, int64_t n, int64_t chunk,
                                                           TopkScratch* sc) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * chunk, end = min(n, base + chunk);
  uint64_t best = 0;
  for (int64_t i = base + threadIdx.x; i < end; i += kThreads) best = max_key(best, cand_key(x[i], i));
  best = block_max_key(best);
  if (threadIdx.x == 0) {
    sc->block_max[blockIdx.x] = best;
    if (blockIdx.x == 0) sc->count = 0;
  }
}

// Pass 2: every block finds that bound (sorting the blocks' maxima) and appends its chunk's
// keys at or above it to the candidates: at least k, and every one of the k best.
__global__ void __launch_bounds__(kThreads) topk_filter_kernel(const float* x, int64_t n, int64_t chunk, int blocks,
                                                              int k, TopkScratch* sc) {
  __shared__ uint64_t s[kBlocks];
  for (int i = threadIdx.x; i < kBlocks; i += kThreads) s[i] = i < blocks ? sc->block_max[i] : 0;
  __syncthreads();
  sort_desc_keys(s, kBlocks);
  const uint64_t bound = s[k - 1];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * chunk, end = min(n, base + chunk);
  for (int64_t i = base + threadIdx.x; i < end; i += kThreads) {
    const uint64_t key = cand_key(x[i], i);
    if (key >= bound) {
      const unsigned long long at = atomicAdd(&sc->count, 1ull);
      if (at < kCandCap) sc->cand[at] = key;
    }
  }
}

// Pass 3, one block: the candidates sorted, the k best out. More than kCandCap candidates
// (ties wider than the cap at the bound: equal logits) take k rounds of the largest key
// below the last over all of x, slow but exact.
__global__ void __launch_bounds__(kSortThreads) topk_final_kernel(const float* x, int64_t n, int k,
                                                                 const TopkScratch* sc, int32_t* out_ids,
                                                                 float* out_vals) {
  __shared__ uint64_t s[kCandCap];
  grid_dependents_launch();  // the draw may launch now and read its parameters, then wait
  const unsigned long long count = sc->count;
  if (count <= kCandCap) {
    int size = 2;
    while (size < static_cast<int>(count)) size <<= 1;
    for (int i = threadIdx.x; i < size; i += kSortThreads) s[i] = i < static_cast<int>(count) ? sc->cand[i] : 0;
    __syncthreads();
    sort_desc_keys(s, size);
    for (int r = threadIdx.x; r < k; r += kSortThreads) {
      out_ids[r] = key_id(s[r]);
      out_vals[r] = key_value(s[r]);
    }
    return;
  }
  uint64_t last = ~0ull;
  for (int r = 0; r < k; ++r) {
    uint64_t best = 0;
    for (int64_t i = threadIdx.x; i < n; i += kSortThreads) {
      const uint64_t key = cand_key(x[i], i);
      if (key < last) best = max_key(best, key);
    }
    last = block_max_key(best);
    if (threadIdx.x == 0) {
      out_ids[r] = key_id(last);
      out_vals[r] = key_value(last);
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

size_t topk_scratch_bytes(int64_t, int) { return sizeof(TopkScratch); }

void launch_topk(const float* x, int64_t n, int k, void* scratch, int32_t* out_ids, float* out_vals,
                 cudaStream_t stream) {
  FRINK_CUDA_CHECK(k >= 1 && k <= kPickMaxTopK && k < n ? cudaSuccess : cudaErrorInvalidValue);
  static_assert(kPickMaxTopK <= kBlocks && kPickMaxTopK <= kCandCap, "the bound needs k blocks");
  // At least k blocks (k < n), at most kBlocks.
  const int64_t chunk = (n + kBlocks - 1) / kBlocks;
  const int blocks = static_cast<int>((n + chunk - 1) / chunk);
  auto* sc = static_cast<TopkScratch*>(scratch);
  topk_max_kernel<<<blocks, kThreads, 0, stream>>>(x, n, chunk, sc);
  FRINK_CUDA_CHECK_LAUNCH();
  topk_filter_kernel<<<blocks, kThreads, 0, stream>>>(x, n, chunk, blocks, k, sc);
  FRINK_CUDA_CHECK_LAUNCH();
  topk_final_kernel<<<1, kSortThreads, 0, stream>>>(x, n, k, sc, out_ids, out_vals);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_draw(const int32_t* ids, const float* vals, int k, const DrawDev* d, int32_t* out, cudaStream_t stream,
                 int32_t* advance) {
  FRINK_CUDA_CHECK(k >= 1 && k <= kPickMaxTopK ? cudaSuccess : cudaErrorInvalidValue);
  static_assert(kPickMaxTopK <= kThreads, "a thread a candidate");
  launch_dependent(draw_kernel, 1, kThreads, 0, stream, ids, vals, k, d, out, advance);
}

}  // namespace frink::cuda
