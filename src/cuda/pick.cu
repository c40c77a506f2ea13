// Penalties and top-k next to the logits (see pick.cuh).
#include "cuda/pick.cuh"

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/pdl.cuh"
#include "cuda/pick_keys.cuh"

namespace frink::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 512;     // the first passes' grid: its blocks' best bound the k-th best (>= kPickMaxTopK)
constexpr int kSortThreads = 1024;
constexpr int kCandCap = 2048;   // candidates the last pass sorts in shared memory (16 KB)

constexpr int kPenThreads = 1024;
constexpr int kPenPerThread = kPickMaxPenalties / kPenThreads;

// sampling::penalized, each operation rounded on its own (the host builds it unfused).
struct Penalty {
  float repeat, frequency, presence;
};
__device__ __forceinline__ float penalized(float l, int count, Penalty p) {
  l = l <= 0.0f ? __fmul_rn(l, p.repeat) : __fdiv_rn(l, p.repeat);
  return __fsub_rn(l, __fadd_rn(__fmul_rn(static_cast<float>(count), p.frequency), p.presence));
}

// One block: the list and the token are read before the wait (host memory, PCIe), so their
// latency hides behind the head's product.
__global__ void __launch_bounds__(kPenThreads) penalties_kernel(float* logits, const PickDev* pick,
                                                               const int32_t* token) {
  const PickDev& p = *pick;
  const int n = p.n_pen;
  const int32_t entering = p.entering ? *token : -1, leaving = p.entering ? p.leaving : -1;
  int32_t id[kPenPerThread], count[kPenPerThread];
  bool listed = false;  // the entering token is in the list
#pragma unroll
  for (int j = 0; j < kPenPerThread; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kPenThreads;
    id[j] = i < n ? p.pen[2 * i] : -1;
    count[j] = i < n ? p.pen[2 * i + 1] : 0;
    listed |= id[j] >= 0 && id[j] == entering;
    count[j] += (id[j] >= 0 && id[j] == entering) - (id[j] >= 0 && id[j] == leaving);
  }
  const Penalty params{p.repeat, p.frequency, p.presence};
  grid_dependency_wait();
#pragma unroll
  for (int j = 0; j < kPenPerThread; ++j)
    if (count[j] > 0) logits[id[j]] = penalized(logits[id[j]], count[j], params);
  // A token not yet in the window enters it once (it cannot be the one leaving: that one is listed).
  if (!__syncthreads_or(listed) && entering >= 0 && threadIdx.x == 0)
    logits[entering] = penalized(logits[entering], 1, params);
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

// The pieces of sampling::finish a block does on a list of at most kPickMaxTopK candidates in
// shared memory, the arithmetic in the host's order: exps in parallel, the sums and walks by
// thread 0 in candidate order (double, rounded one operation at a time).

// sampling::top_p's cut of the sorted list s_v[0, n) (softmax at temperature 1): the first
// i + 1 where its terms over the total (the list's own, or *mass: every logit's) add up to p;
// 0 where they stay below p. Every thread calls it; s_e is scratch. The divisions run in
// parallel, off the walk's chain of adds.
__device__ int top_p_cut(const float* s_v, double* s_e, int n, const double* mass, float p) {
  __shared__ double s_total;
  __shared__ int s_keep;
  const int t = threadIdx.x;
  if (t < n) s_e[t] = exp(static_cast<double>(s_v[t]) - static_cast<double>(s_v[0]));
  __syncthreads();
  if (t == 0) s_total = mass ? *mass : sum_in_order(s_e, n);
  __syncthreads();
  if (t < n) s_e[t] = __ddiv_rn(s_e[t], s_total);
  __syncthreads();
  if (t == 0) {
    double cum = 0;
    int keep = 0;
    for (int i = 0; i < n; ++i) {
      cum = __dadd_rn(cum, s_e[i]);
      if (cum >= p) {
        keep = i + 1;
        break;
      }
    }
    s_keep = keep;
  }
  __syncthreads();
  return s_keep;
}

// sampling::min_p on the sorted list s_v[0, n): the kept prefix, at least the first. Every
// thread calls it.
__device__ int min_p_keep(const float* s_v, int n, float min_logit) {
  return max(1, __syncthreads_count(static_cast<int>(threadIdx.x) < n && s_v[threadIdx.x] >= min_logit));
}

// The draw's end of sampling::finish on the list (s_v, s_id)[0, n), one chunk (n <= kPickSumChunk),
// whose largest value is vmax: the token at u along the mass, into *out by thread 0.
__device__ void draw_list(const float* s_v, const int32_t* s_id, double* s_e, int n, float vmax, const DrawDev& d,
                          int32_t* out, int32_t* advance) {
  if (static_cast<int>(threadIdx.x) < n) s_e[threadIdx.x] = temp_term(s_v[threadIdx.x], vmax, d.temp);
  __syncthreads();
  if (threadIdx.x == 0) {
    const double at = __dmul_rn(d.u, sum_in_order(s_e, n));
    double cum = 0;
    int32_t id = s_id[n - 1];  // the last takes any rounding remainder
    for (int i = 0; i < n; ++i) {
      cum = __dadd_rn(cum, s_e[i]);
      if (at < cum) {
        id = s_id[i];
        break;
      }
    }
    *out = id;
    if (advance) ++*advance;
  }
}

// sampling::finish on the sorted top k.
__global__ void __launch_bounds__(kThreads) draw_kernel(const int32_t* ids, const float* vals, int k, const DrawDev* dp,
                                                       int32_t* out, int32_t* advance) {
  __shared__ float s_v[kPickMaxTopK];
  __shared__ int32_t s_id[kPickMaxTopK];
  __shared__ double s_e[kPickMaxTopK];
  const DrawDev d = *dp;  // host memory written before the launch: nothing before this kernel writes it
  grid_dependency_wait();
  const int t = threadIdx.x;
  if (t < k) {
    s_v[t] = vals[t];
    s_id[t] = ids[t];
  }
  __syncthreads();
  const float vmax = s_v[0];
  int n = k;
  if (d.top_p < 1.0f) {  // sampling::top_p over the list alone; rounding short of p keeps all
    const int keep = top_p_cut(s_v, s_e, n, nullptr, d.top_p);
    if (keep > 0) n = keep;
  }
  if (d.min_p > 0.0f) n = min_p_keep(s_v, n, __fadd_rn(vmax, d.log_min_p));
  draw_list(s_v, s_id, s_e, n, vmax, d, out, advance);
}

// Top-k off: what sampling::finish sums over every logit. Block c: the sum in order of chunk
// c's terms, top-p's (temperature 1) when top-p is on, else the draw's when min-p is off too;
// nothing when min-p decides from the list alone. vals[0]: the largest logit.
__global__ void __launch_bounds__(kPickSumChunk) draw_sums_kernel(const float* x, int64_t n, const float* vals,
                                                                 const DrawDev* dp, double* sums) {
  const DrawDev d = *dp;
  const bool top_p = d.top_p < 1.0f;
  if (!top_p && d.min_p > 0.0f) return;
  const float vmax = vals[0];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPickSumChunk, i = base + threadIdx.x;
  double e = 0;
  if (i < n)
    e = top_p ? exp(static_cast<double>(x[i]) - static_cast<double>(vmax)) : temp_term(x[i], vmax, d.temp);
  store_chunk_sum(e, sums);  // + 0 past n: the same sum
}

// sampling::finish over all n logits (top-k off) from their sorted top kPickMaxTopK and the
// chunk sums: exact where those decide it, else *out = -1 (undecided).
__global__ void __launch_bounds__(kThreads) draw_whole_kernel(const float* x, int64_t n, const int32_t* ids,
                                                             const float* vals, const double* sums, const DrawDev* dp,
                                                             int32_t* out, int32_t* advance) {
  constexpr int k = kPickMaxTopK;
  __shared__ float s_v[k];
  __shared__ int32_t s_id[k];
  __shared__ double s_e[k];
  __shared__ double s_sums[kPickMaxVocab / kPickSumChunk];
  __shared__ double s_total;
  const DrawDev d = *dp;
  grid_dependency_wait();
  const int t = threadIdx.x;
  const int chunks = static_cast<int>((n + kPickSumChunk - 1) / kPickSumChunk);
  s_v[t] = vals[t];
  s_id[t] = ids[t];
  const bool mass = d.top_p < 1.0f || d.min_p <= 0.0f;  // the chunk sums were taken
  if (mass)
    for (int c = t; c < chunks; c += kThreads) s_sums[c] = sums[c];
  __syncthreads();
  if (t == 0 && mass) s_total = sum_in_order(s_sums, chunks);  // the mass of every logit
  __syncthreads();
  const float vmax = s_v[0];
  const float min_logit = __fadd_rn(vmax, d.log_min_p);
  // Min-p's survivors are fewer than the list, so all in it (a prefix of it).
  const bool min_p_within = d.min_p > 0.0f && s_v[k - 1] < min_logit;
  const auto undecided = [&] {
    if (t == 0) {
      *out = -1;
      if (advance) ++*advance;
    }
  };
  int len = 0;  // the survivors, a prefix of the sorted list
  if (d.top_p < 1.0f) {
    len = top_p_cut(s_v, s_e, k, &s_total, d.top_p);
    if (len > 0 && d.min_p > 0.0f) {
      len = min_p_keep(s_v, len, min_logit);
    } else if (len == 0) {  // the cut lies past the list: min-p's survivors, where they are fewer
      if (!min_p_within) return undecided();
      len = min_p_keep(s_v, k, min_logit);
    }
  } else if (d.min_p > 0.0f) {  // min-p alone keeps its survivors in id order
    if (!min_p_within) return undecided();
    len = min_p_keep(s_v, k, min_logit);
    const float v = s_v[t];
    const int32_t id = s_id[t];
    int rank = 0;
    for (int j = 0; j < len; ++j) rank += s_id[j] < id;
    __syncthreads();
    if (t < len) {
      s_v[rank] = v;
      s_id[rank] = id;
    }
    __syncthreads();
  } else {  // nothing cuts: the draw over every logit in id order, by chunks
    __shared__ double s_at;
    if (t == 0) s_at = __dmul_rn(d.u, s_total);
    __syncthreads();
    const int64_t pos =
        walk_chunks(s_sums, chunks, n, s_at, true, [&](int64_t i) { return temp_term(x[i], vmax, d.temp); });
    if (t == 0) {
      *out = static_cast<int32_t>(min(pos, n - 1));  // the last takes any rounding remainder
      if (advance) ++*advance;
    }
    return;
  }
  draw_list(s_v, s_id, s_e, len, vmax, d, out, advance);
}

}  // namespace

void launch_penalties(float* logits, const PickDev* pick, const int32_t* token, cudaStream_t stream) {
  static_assert(kPickMaxPenalties % kPenThreads == 0, "whole pairs a thread");
  launch_dependent(penalties_kernel, 1, kPenThreads, 0, stream, logits, pick, token);
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
  static_assert(kPickMaxTopK <= kThreads && kPickMaxTopK <= kPickSumChunk, "a thread a candidate, one chunk");
  launch_dependent(draw_kernel, 1, kThreads, 0, stream, ids, vals, k, d, out, advance);
}

size_t draw_sums_bytes(int64_t n) {
  return static_cast<size_t>((n + kPickSumChunk - 1) / kPickSumChunk) * sizeof(double);
}

void launch_draw_whole(const float* x, int64_t n, const int32_t* ids, const float* vals, const DrawDev* d, double* sums,
                       int32_t* out, cudaStream_t stream, int32_t* advance) {
  FRINK_CUDA_CHECK(n > kPickMaxTopK && n <= kPickMaxVocab ? cudaSuccess : cudaErrorInvalidValue);
  static_assert(kPickMaxTopK == kThreads, "a thread a candidate");
  const int64_t chunks = (n + kPickSumChunk - 1) / kPickSumChunk;
  draw_sums_kernel<<<static_cast<unsigned>(chunks), kPickSumChunk, 0, stream>>>(x, n, vals, d, sums);
  FRINK_CUDA_CHECK_LAUNCH();
  launch_dependent(draw_whole_kernel, 1, kThreads, 0, stream, x, n, ids, vals, sums, d, out, advance);
}

}  // namespace frink::cuda
