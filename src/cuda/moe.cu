// Mixture-of-experts routing and combination on the device (see moe.cuh).
#include "cuda/moe.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/route_token.cuh"

namespace frink::cuda {

namespace {

// kPer experts per lane: the launch picks the fewest that hold n_expert (a 128-expert router
// walked 16 slots per lane, 12 of them empty, in every loop of the top-k).
template <int kPer>
__global__ void route_kernel(RouteParams p) {
  const int64_t t = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (t < p.n_tok) route_token<kPer>(p, t, nullptr, true);
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

__global__ void slot_bias_kernel(float* y, int64_t y_stride, int64_t width, const float* bias, const int32_t* expert,
                                 const int32_t* pos, int64_t n_slots) {
  const int64_t n = n_slots * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = i / width, c = i % width;
    y[pos[s] * y_stride + c] += bias[expert[s] * width + c];
  }
}

}  // namespace

void launch_slot_bias(float* y, int64_t y_stride, int64_t width, const float* bias, const int32_t* expert,
                      const int32_t* pos, int64_t n_slots, cudaStream_t stream) {
  const int64_t n = n_slots * width;
  if (n == 0) return;
  slot_bias_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, stream>>>(
      y, y_stride, width, bias, expert, pos, n_slots);
  FRINK_CUDA_CHECK_LAUNCH();
}

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

bool route_params_ok(const RouteParams& p) {
  return p.n_expert > 0 && p.n_expert <= kMoeMaxExperts && p.k > 0 && p.n_shared >= 0 && p.k + p.n_shared <= kMaxUsed &&
         p.k <= p.n_expert && p.gating >= 0 && p.gating <= 2 &&
         (p.n_group <= 1 || (p.n_group <= 32 && p.n_expert % p.n_group == 0 && p.n_group_used >= 1 &&
                             p.n_group_used * (p.n_expert / p.n_group) >= p.k));
}

void launch_route(const RouteParams& p) {
  FRINK_CUDA_CHECK(route_params_ok(p) ? cudaSuccess : cudaErrorInvalidValue);
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
