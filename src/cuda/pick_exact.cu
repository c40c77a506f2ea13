// The whole-vocabulary draw where the device's 256 best could not decide it (launch_draw_whole's
// -1): sampling::finish over every logit, exactly, on the device (pick.cuh). Top-p's survivors
// are a prefix of the vocabulary sorted (a CUB radix sort of the candidates' keys); its cut and
// the draw walk that prefix by chunks of sorted positions, as the host walks them. Min-p alone
// keeps its survivors in id order: their ids sort first under keys that put the rest last.
#include <algorithm>
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_check.h"
#include "cuda/pick.cuh"
#include "cuda/pick_keys.cuh"

namespace frink::cuda {

namespace {

constexpr int kChunk = kPickSumChunk;  // a block a chunk of candidates
constexpr int kMaxChunks = static_cast<int>(kPickMaxVocab / kPickSumChunk);

struct ExactState {
  uint32_t vmax_ord;  // value_ord of the largest logit
  int len;            // the survivors
  double total;       // top-p's mass of every logit
};

// The survivors' list, candidate order: the sorted keys' prefix, or ids (in id order) into x.
struct SortedList {
  const uint64_t* keys;
  __device__ float value(int i) const { return key_value(keys[i]); }
  __device__ int32_t id(int i) const { return key_id(keys[i]); }
};
struct IdList {
  const uint32_t* ids;
  const float* x;
  __device__ float value(int i) const { return x[ids[i]]; }
  __device__ int32_t id(int i) const { return static_cast<int32_t>(ids[i]); }
};

__device__ float vmax_of(const ExactState* st) { return ord_value(st->vmax_ord); }

__global__ void __launch_bounds__(kChunk) keys_kernel(const float* x, int64_t n, uint64_t* keys, ExactState* st) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  if (i < n) {
    keys[i] = cand_key(x[i], i);
    atomicMax(&st->vmax_ord, value_ord(x[i]));
  }
}

// sums[c] = chunk c's terms in order: top-p's (temperature 1) over ids (by_id, over all n), or
// the draw's over the list's first st->len.
template <class List>
__global__ void __launch_bounds__(kChunk) chunk_sums_kernel(const float* x, int64_t n, List list, bool by_id,
                                                          float temp, const ExactState* st, double* sums) {
  const int64_t len = by_id ? n : st->len, i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  if (blockIdx.x * int64_t{kChunk} >= len) return;
  const float vmax = vmax_of(st);
  double e = 0;
  if (i < len)
    e = by_id ? exp(static_cast<double>(x[i]) - static_cast<double>(vmax))
              : temp_term(list.value(static_cast<int>(i)), vmax, temp);
  store_chunk_sum(e, sums);  // + 0 past len: the same sum
}

// s_sums = sums[0, chunks), by the block.
__device__ void load_sums(const double* sums, int chunks, double* s_sums) {
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) s_sums[c] = sums[c];
  __syncthreads();
}

__global__ void __launch_bounds__(kChunk) total_kernel(const double* sums, int chunks, ExactState* st) {
  __shared__ double s_sums[kMaxChunks];
  load_sums(sums, chunks, s_sums);
  if (threadIdx.x == 0) st->total = sum_in_order(s_sums, chunks);
}

// sums[c] = the sorted chunk c's top-p terms over the mass, in order (sampling::top_p's walk).
__global__ void __launch_bounds__(kChunk) sorted_mass_kernel(const uint64_t* keys, int64_t n, const ExactState* st,
                                                           double* sums) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  store_chunk_sum(
      i < n ? __ddiv_rn(exp(static_cast<double>(key_value(keys[i])) - static_cast<double>(vmax_of(st))), st->total)
            : 0.0,
      sums);
}

// sampling::top_p's cut of the sorted keys, then min_p on the prefix: st->len.
__global__ void __launch_bounds__(kChunk) top_p_cut_kernel(const uint64_t* keys, int64_t n, const double* sums,
                                                         DrawDev d, ExactState* st) {
  __shared__ double s_sums[kMaxChunks];
  const int chunks = static_cast<int>((n + kChunk - 1) / kChunk);
  load_sums(sums, chunks, s_sums);
  const float vmax = vmax_of(st);
  const double total = st->total;
  const int64_t at = walk_chunks(s_sums, chunks, n, d.top_p, false, [&](int64_t i) {
    return __ddiv_rn(exp(static_cast<double>(key_value(keys[i])) - static_cast<double>(vmax)), total);
  });
  if (threadIdx.x == 0) {
    int64_t len = at < n ? at + 1 : n;  // rounding short of p keeps all
    if (d.min_p > 0.0f) {  // the sorted prefix's values at or above min_logit, at least the first
      const float min_logit = __fadd_rn(vmax, d.log_min_p);
      int64_t lo = 0, hi = len;  // keys[0, lo) pass, keys[hi, len) fail
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (key_value(keys[mid]) >= min_logit) lo = mid + 1; else hi = mid;
      }
      len = max(int64_t{1}, lo);
    }
    st->len = static_cast<int>(len);
  }
}

// Min-p alone: keys that sort the survivors' ids first, in id order, the rest after them.
__global__ void __launch_bounds__(kChunk) min_p_ids_kernel(const float* x, int64_t n, float log_min_p, ExactState* st,
                                                         uint32_t* ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  const float min_logit = __fadd_rn(vmax_of(st), log_min_p);
  const bool kept = i < n && x[i] >= min_logit;
  if (i < n) ids[i] = kept ? static_cast<uint32_t>(i) : 0xffffffffu;
  const int count = __syncthreads_count(kept);
  if (threadIdx.x == 0 && count > 0) atomicAdd(&st->len, count);
}

// The draw over the list's first st->len: temperature, the mass by chunks (sums), the token.
template <class List>
__global__ void __launch_bounds__(kChunk) list_draw_kernel(List list, const double* sums, DrawDev d,
                                                         const ExactState* st, int32_t* out) {
  __shared__ double s_sums[kMaxChunks];
  __shared__ double s_at;
  const int64_t len = st->len;
  if (len == 0) {  // min-p above 1 (launch_draw_whole decides those): nothing to draw from
    if (threadIdx.x == 0) *out = -1;
    return;
  }
  const int chunks = static_cast<int>((len + kChunk - 1) / kChunk);
  load_sums(sums, chunks, s_sums);
  if (threadIdx.x == 0) s_at = __dmul_rn(d.u, sum_in_order(s_sums, chunks));
  __syncthreads();
  const float vmax = vmax_of(st);
  const int64_t pos = walk_chunks(s_sums, chunks, len, s_at, true,
                                  [&](int64_t i) { return temp_term(list.value(static_cast<int>(i)), vmax, d.temp); });
  if (threadIdx.x == 0) *out = list.id(static_cast<int>(min(pos, len - 1)));  // the last takes any remainder
}

struct ExactLayout {
  size_t keys_in, keys_out, ids_in, ids_out, sums, mass, state, temp, bytes;
  size_t temp_bytes;
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

ExactLayout exact_layout(int64_t n) {
  const size_t un = static_cast<size_t>(n), chunks = (un + kChunk - 1) / kChunk;
  size_t sort64 = 0, sort32 = 0;
  FRINK_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort64, static_cast<uint64_t*>(nullptr),
                                                            static_cast<uint64_t*>(nullptr), n));
  FRINK_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, sort32, static_cast<uint32_t*>(nullptr),
                                                  static_cast<uint32_t*>(nullptr), n));
  ExactLayout l{};
  size_t at = 0;
  const auto take = [&](size_t b) { const size_t p = at; at += align256(b); return p; };
  l.keys_in = take(un * 8);
  l.keys_out = take(un * 8);
  l.ids_in = take(un * 4);
  l.ids_out = take(un * 4);
  l.sums = take(chunks * 8);
  l.mass = take(chunks * 8);
  l.state = take(sizeof(ExactState));
  l.temp_bytes = std::max(sort64, sort32);
  l.temp = take(l.temp_bytes);
  l.bytes = at;
  return l;
}

}  // namespace

size_t exact_draw_scratch_bytes(int64_t n) { return exact_layout(n).bytes; }

void launch_exact_draw(const float* x, int64_t n, const DrawDev& d, void* scratch, int32_t* out, cudaStream_t stream) {
  FRINK_CUDA_CHECK(n > 0 && n <= kPickMaxVocab ? cudaSuccess : cudaErrorInvalidValue);
  const ExactLayout l = exact_layout(n);
  auto* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint64_t*>(base + l.keys_in);
  auto* keys_out = reinterpret_cast<uint64_t*>(base + l.keys_out);
  auto* ids_in = reinterpret_cast<uint32_t*>(base + l.ids_in);
  auto* ids_out = reinterpret_cast<uint32_t*>(base + l.ids_out);
  auto* sums = reinterpret_cast<double*>(base + l.sums);
  auto* mass = reinterpret_cast<double*>(base + l.mass);
  auto* st = reinterpret_cast<ExactState*>(base + l.state);
  size_t temp_bytes = l.temp_bytes;
  const unsigned chunks = static_cast<unsigned>((n + kChunk - 1) / kChunk);
  FRINK_CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof(ExactState), stream));
  keys_kernel<<<chunks, kChunk, 0, stream>>>(x, n, keys_in, st);
  FRINK_CUDA_CHECK_LAUNCH();
  if (d.top_p < 1.0f) {
    FRINK_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(base + l.temp, temp_bytes, keys_in, keys_out, n, 0, 64,
                                                              stream));
    const SortedList list{keys_out};
    chunk_sums_kernel<<<chunks, kChunk, 0, stream>>>(x, n, list, true, d.temp, st, sums);
    FRINK_CUDA_CHECK_LAUNCH();
    total_kernel<<<1, kChunk, 0, stream>>>(sums, static_cast<int>(chunks), st);
    FRINK_CUDA_CHECK_LAUNCH();
    sorted_mass_kernel<<<chunks, kChunk, 0, stream>>>(keys_out, n, st, mass);
    FRINK_CUDA_CHECK_LAUNCH();
    top_p_cut_kernel<<<1, kChunk, 0, stream>>>(keys_out, n, mass, d, st);
    FRINK_CUDA_CHECK_LAUNCH();
    chunk_sums_kernel<<<chunks, kChunk, 0, stream>>>(x, n, list, false, d.temp, st, sums);
    FRINK_CUDA_CHECK_LAUNCH();
    list_draw_kernel<<<1, kChunk, 0, stream>>>(list, sums, d, st, out);
  } else {
    // Min-p alone (top-p off); the draw with nothing cutting never comes back undecided, but
    // takes this path too: every id survives a min-p of 0.
    min_p_ids_kernel<<<chunks, kChunk, 0, stream>>>(x, n, d.min_p > 0.0f ? d.log_min_p : -INFINITY, st, ids_in);
    FRINK_CUDA_CHECK_LAUNCH();
    FRINK_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(base + l.temp, temp_bytes, ids_in, ids_out, n, 0, 32, stream));
    const IdList list{ids_out, x};
    chunk_sums_kernel<<<chunks, kChunk, 0, stream>>>(x, n, list, false, d.temp, st, sums);
    FRINK_CUDA_CHECK_LAUNCH();
    list_draw_kernel<<<1, kChunk, 0, stream>>>(list, sums, d, st, out);
  }
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
