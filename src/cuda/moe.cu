// Mixture-of-experts routing and combination on the device (see moe.cuh).
#include "cuda/moe.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

constexpr int kMaxUsed = 32;               // experts chosen per token, at most
constexpr float kMinWeightSum = 6.103515625e-5f;  // llama.cpp's clamp of the weight sum (f16 min normal)

// (selection score, expert) as one 64-bit key whose unsigned order is the host's partial_sort
// order: the larger score first, the lower expert on ties. A warp's argmax in the top-k loop
// is then a max over one 64-bit value per level (two shuffles), where it compared score,
// expert and probability (three shuffles and a branchy select), k times per token. Measured
// with the router's geometry (matvec.cu, kFewRows): qwen3-30b-a3b tg128 graph 2.728 -> 2.645
// ms (H200, one call, alternating). 0 is below every key: no expert.
__device__ __forceinline__ uint64_t rank_key(float s, int e) {
  if (s == 0.0f) s = 0.0f;  // -0 ranks as +0 (equal scores), as in the host's float compare
  uint32_t u = __float_as_uint(s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // IEEE order as unsigned order (no NaN here)
  return (uint64_t{u} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(e));
}

// A shared expert's gate weight, sigmoid(v), as llama.cpp (qwen2moe) writes it: silu(v) / v.
// The routing (a stacked shared expert's slot) and the combine (a separate one) both take it
// from here, so the two paths weigh the shared expert with the same bits.
__device__ __forceinline__ float shared_gate_weight(float v) { return v / (1.0f + expf(-v)) / v; }

// The largest of a lane's keys, as a tree: the linear scan was a chain of kPer dependent
// 64-bit selects per top-k step (16 of them for a 512-expert router).
template <int kPer>
__device__ __forceinline__ uint64_t lane_max_key(const uint64_t (&key)[kPer]) {
  uint64_t m[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) m[i] = key[i];
#pragma unroll
  for (int w = 1; w < kPer; w *= 2)
#pragma unroll
    for (int i = 0; i + w < kPer; i += 2 * w) m[i] = m[i + w] > m[i] ? m[i + w] : m[i];
  return m[0];
}

// The warp's largest key: the scores' word by one redux.sync, then the expert word among the
// lanes holding that score by another (the key's order: score, then the lower expert), where
// five levels of two 32-bit shuffles and a 64-bit compare each stood.
__device__ __forceinline__ uint64_t warp_max_key(uint64_t key) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto hi = static_cast<uint32_t>(key >> 32), top = __reduce_max_sync(0xffffffffu, hi);
  const uint32_t lo = __reduce_max_sync(0xffffffffu, hi == top ? static_cast<uint32_t>(key) : 0u);
  return (uint64_t{top} << 32) | lo;
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, key, o);
    key = other > key ? other : key;
  }
  return key;
#endif
}

// kPer experts per lane: the launch picks the fewest that hold n_expert (a 128-expert router
// walked 16 slots per lane, 12 of them empty, in every loop of the top-k).
template <int kPer>
__global__ void route_kernel(RouteParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t t = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (t >= p.n_tok) return;
  const int E = static_cast<int>(p.n_expert);
  const float* lg = p.logits + t * (p.n_expert + (p.shared == 2));
  float prob[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    prob[i] = e < E ? lg[e] : -INFINITY;
  }
  if (p.gating == 0) {
    // softmax_inplace: max, exp (-inf -> 0), sum in double, times the float reciprocal
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) mx = fmaxf(mx, prob[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      prob[i] = prob[i] == -INFINITY ? 0.0f : expf(prob[i] - mx);
      sum += prob[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] *= inv;
  } else if (p.gating == 1) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] = 1.0f / (1.0f + expf(-prob[i]));
  }
  uint64_t key[kPer];  // 0 for lanes past the experts: never chosen
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      const float s = p.sel_bias ? prob[i] + p.sel_bias[e] : prob[i];
      key[i] = rank_key(isnan(s) ? -INFINITY : s, e);  // a NaN score still yields a valid expert
    } else {
      key[i] = 0;
    }
  }
  float w[kMaxUsed];
  int chosen[kMaxUsed];
  const int k = static_cast<int>(p.k);
  for (int j = 0; j < k; ++j) {
    const uint64_t best = warp_max_key(lane_max_key(key));
    const int be = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(best));
    float mine = 0.0f;  // the winner's lane holds its probability
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) {
        mine = prob[i];
        key[i] = 0;
      }
    chosen[j] = be;
    w[j] = __shfl_sync(0xffffffffu, mine, be % 32);
  }
  if (lane != 0) return;
  if (p.gating == 2) {  // softmax over the chosen (softmax_inplace again)
    float mx = -INFINITY;
    for (int j = 0; j < k; ++j) mx = fmaxf(mx, w[j]);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      w[j] = w[j] == -INFINITY ? 0.0f : expf(w[j] - mx);
      sum += w[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < k; ++j) w[j] *= inv;
  }
  if (p.norm_w) {
    double sum = 0.0;  // ggml_sum_rows accumulates in ggml_float
    for (int j = 0; j < k; ++j) sum += w[j];
    const float s = fmaxf(static_cast<float>(sum), kMinWeightSum);
    for (int j = 0; j < k; ++j) w[j] /= s;
  }
  if (p.w_scale != 0.0f && p.w_scale != 1.0f)
    for (int j = 0; j < k; ++j) w[j] *= p.w_scale;
  const int64_t slots = k + (p.shared != 0);
  for (int j = 0; j < k; ++j) {
    p.expert[t * slots + j] = chosen[j];
    p.weight[t * slots + j] = w[j];
  }
  if (p.shared) {
    p.expert[t * slots + k] = E;
    p.weight[t * slots + k] = p.shared == 2 ? shared_gate_weight(lg[E]) : 1.0f;
  }
}

// Slots of a token whose outputs combine_kernel loads before its first multiply-add.
constexpr int kCombineLoads = 16;

__global__ void combine_kernel(CombineParams p) {
  const int64_t n = p.n_tok * p.n_embd;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.n_embd, d = i % p.n_embd;
    const float* w = p.weight + t * p.k;
    const float* y = p.y + t * p.k * p.n_embd + d;
    // The first kCombineLoads slots' values all loaded before the sum: the loop over the
    // runtime k waited for each slot's load before it issued the next, a chain of k L2 round
    // trips an element (qwen3-30b-a3b: 8; the combine cost 0.11 of a 2.11 ms token graph).
    float yv[kCombineLoads], wv[kCombineLoads];
#pragma unroll
    for (int j = 0; j < kCombineLoads; ++j)
      if (j < p.k) {
        yv[j] = y[j * p.n_embd];
        wv[j] = w[j];
      }
    float o = yv[0] * wv[0];
#pragma unroll
    for (int j = 1; j < kCombineLoads; ++j)
      if (j < p.k) o += yv[j] * wv[j];
    for (int64_t j = kCombineLoads; j < p.k; ++j) o += y[j * p.n_embd] * w[j];
    if (p.shared) {
      const float g = p.shared_gate ? shared_gate_weight(p.shared_gate[t]) : 1.0f;
      o += p.shared[i] * g;
    }
    p.out[i] = p.residual ? p.residual[i] + o : o;
  }
}

__global__ void __launch_bounds__(1024) sort_slots_kernel(SlotSort p) {
  __shared__ int32_t ids[kMoeSortMaxSlots];
  __shared__ int32_t cursor[kMoeMaxStack];
  const int S = static_cast<int>(p.n_slots), E = static_cast<int>(p.n_expert);
  for (int e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    ids[s] = p.expert[s];
    atomicAdd(&cursor[ids[s]], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // counts out, cursors to each expert's first row
    int first = 0;
    for (int e = 0; e < E; ++e) {
      const int c = cursor[e];
      p.count[e] = c;
      cursor[e] = first;
      first += c;
    }
  }
  __syncthreads();
  // Warp 0 walks the slots 32 at a time, in slot order: lanes of one expert take consecutive
  // rows by lane, their leader advances the expert's cursor (so rows follow slot order).
  if (threadIdx.x >= 32) return;
  const unsigned lane = threadIdx.x;
  for (int s0 = 0; s0 < S; s0 += 32) {
    const int s = s0 + static_cast<int>(lane);
    const bool in = s < S;
    const int e = in ? ids[s] : -1 - static_cast<int>(lane);  // lanes past the end match only themselves
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int leader = __ffs(peers) - 1;
    int base = in && static_cast<int>(lane) == leader ? cursor[e] : 0;
    base = __shfl_sync(0xffffffffu, base, leader);
    if (in) p.pos[s] = base + __popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if (in && static_cast<int>(lane) == leader) cursor[e] = base + __popc(peers);
    __syncwarp();
  }
}

__global__ void slot_rows_kernel(float* dst, const float* src, int64_t width, const int32_t* pos, int64_t n_slots,
                                 int64_t x_div, bool to_rows) {
  const int64_t n = n_slots * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = i / width, c = i % width, row = pos[s];
    if (to_rows) dst[row * width + c] = src[(s / x_div) * width + c];
    else dst[i] = src[row * width + c];
  }
}

}  // namespace

void launch_sort_slots(const SlotSort& p) {
  FRINK_CUDA_CHECK(p.n_slots > 0 && p.n_slots <= kMoeSortMaxSlots && p.n_expert > 0 && p.n_expert <= kMoeMaxStack
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  sort_slots_kernel<<<1, 1024, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_slot_rows(float* dst, const float* src, int64_t width, const int32_t* pos, int64_t n_slots, int64_t x_div,
                      bool to_rows, cudaStream_t stream) {
  const int64_t n = n_slots * width;
  if (n == 0) return;
  slot_rows_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, stream>>>(
      dst, src, width, pos, n_slots, x_div, to_rows);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_route(const RouteParams& p) {
  FRINK_CUDA_CHECK(p.n_expert > 0 && p.n_expert <= kMoeMaxExperts && p.k > 0 && p.k + (p.shared != 0) <= kMaxUsed &&
                           p.k <= p.n_expert && p.gating >= 0 && p.gating <= 2 && p.shared >= 0 && p.shared <= 2
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const int64_t threads = p.n_tok * 32;
  const auto grid = static_cast<unsigned>((threads + 127) / 128);
  static_assert(kMoeMaxExperts == 16 * 32, "route_kernel<16> holds the most experts");
  // A plain launch: as a dependent (the router releasing it at its start, the experts' gate/up
  // released by it) the token took 2.71 ms against 2.62 (qwen3-30b-a3b, H200, one call).
  if (p.n_expert <= 4 * 32) route_kernel<4><<<grid, 128, 0, p.stream>>>(p);
  else if (p.n_expert <= 8 * 32) route_kernel<8><<<grid, 128, 0, p.stream>>>(p);
  else route_kernel<16><<<grid, 128, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const CombineParams& p) {
  const int64_t n = p.n_tok * p.n_embd;
  if (n == 0) return;
  combine_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
