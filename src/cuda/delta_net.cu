// Gated DeltaNet steps on the device (see delta_net.cuh).
//
// v1 (this file): correctness first. The recurrence runs token after token inside one launch
// per segment (the state stays in registers across the segment's tokens, the next token's
// inputs are fetched while the current one computes); a chunked (WY) prefill kernel, which
// turns most of the work into matrix products, is the next version. Not yet timed.
#include "cuda/delta_net.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

constexpr int kRows = 16;  // rows of the state per thread in the recurrence

unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>(std::min<int64_t>((n + per_block - 1) / per_block, 1 << 20));
}

__global__ void gates_kernel(DeltaGatesParams p) {
  const int64_t n = p.n_tok * p.n_v_head;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.n_v_head, hv = i % p.n_v_head;
    const float* row = p.ba + t * 2 * p.n_v_head;
    float b, a;
    if (p.fused) {
      const int64_t rf = p.n_v_head / p.n_k_head, kh = hv / rf, r = hv % rf;
      b = row[kh * 2 * rf + r];
      a = row[kh * 2 * rf + rf + r];
    } else {
      b = row[hv];
      a = row[p.n_v_head + hv];
    }
    p.beta[i] = 1.0f / (1.0f + expf(-b));
    // ggml's softplus: log(1 + e^x), and x itself above 20 where the two agree in f32
    const float x = a + p.dt_bias[hv];
    p.g[i] = (x > 20.0f ? x : log1pf(expf(x))) * p.a[hv];
  }
}

// Input u of the convolution: u >= 0 a new row, u < 0 the state's row width - 1 + u.
__device__ __forceinline__ float conv_input(const ConvParams& p, int64_t u, int64_t c) {
  return u >= 0 ? p.x[u * p.x_stride + c] : p.state[(p.width - 1 + u) * p.channels + c];
}

__global__ void conv_kernel(ConvParams p) {
  const int64_t n = p.n_tok * p.channels, K = p.width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.channels, c = i % p.channels;
    float s = 0.0f;
    for (int64_t j = 0; j < K; ++j) s += conv_input(p, t + j - (K - 1), c) * p.w[c * K + j];
    if (p.bias) s += p.bias[c];
    p.y[t * p.y_stride + c] = s / (1.0f + expf(-s));
  }
}

// The state becomes inputs [n_tok - (width - 1), n_tok). Row r reads input n_tok - (width-1) + r,
// which (when negative) is old state row n_tok + r > r: rows are written in ascending order by
// the channel's one thread, so every old row is read before it is overwritten.
__global__ void conv_state_kernel(ConvParams p) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= p.channels) return;
  const int64_t k1 = p.width - 1;
  for (int64_t r = 0; r < k1; ++r) p.state[r * p.channels + c] = conv_input(p, p.n_tok - k1 + r, c);
}

__global__ void l2_norm_kernel(L2NormParams p) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;  // uniform per warp
  const int lane = threadIdx.x % 32;
  if (row >= p.n_tok * p.n_head) return;
  float* x = p.x + (row / p.n_head) * p.x_stride + (row % p.n_head) * p.n;
  float ss = 0.0f;
  for (int64_t i = lane; i < p.n; i += 32) ss += x[i] * x[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float scale = 1.0f / fmaxf(sqrtf(ss), p.eps);
  for (int64_t i = lane; i < p.n; i += 32) x[i] *= scale;
}

// Block (32, W): lane = column j within the block's 32, warp w = rows [16 w, 16 w + 16) of the
// state. Shared: q and k of the token (padded with zeros to 16 W rows, so rows past d add
// nothing and need no test), and the per-warp partial sums of S^T k and S^T q.
__global__ void __launch_bounds__(512) delta_rule_kernel(DeltaRuleParams p) {
  extern __shared__ float sh[];
  const int lane = static_cast<int>(threadIdx.x), w = static_cast<int>(threadIdx.y), W = static_cast<int>(blockDim.y);
  const int tid = w * 32 + lane, n_threads = W * 32;
  const int64_t d = p.d, hv = blockIdx.x, nv = p.n_v_head, nk = p.n_k_head;
  const int64_t j = int64_t{blockIdx.y} * 32 + lane;
  const bool col = j < d;
  const int64_t hk = p.kv_head_tiled ? hv % nk : hv / (nv / nk);
  const int64_t padded = int64_t{W} * kRows;
  float* q_s = sh;
  float* k_s = sh + padded;
  float* red_k = k_s + padded;  // [W][32]: partial S^T k
  float* red_q = red_k + n_threads;  // [W][32]: partial S^T q
  for (int64_t i = d + tid; i < padded; i += n_threads) q_s[i] = k_s[i] = 0.0f;
  float* S = p.state + hv * d * d;
  const int64_t i0 = int64_t{w} * kRows;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = col && i0 + r < d ? S[(i0 + r) * d + j] : 0.0f;

  // Token t's inputs are loaded into registers while token t - 1 computes, so a prefill does
  // not wait a global-memory latency per token. 32 * ceil(d / 16) threads >= d: each thread
  // holds at most one element of q and of k.
  const bool loads = tid < d;
  float nq = 0.0f, nkk = 0.0f, nv_ = 0.0f, ng = 0.0f, nb = 0.0f;
  const auto fetch = [&](int64_t t) {
    const float* row = p.qkv + t * p.qkv_stride;
    if (loads) {
      nq = row[hk * d + tid];
      nkk = row[(nk + hk) * d + tid];
    }
    nv_ = col ? row[2 * nk * d + hv * d + j] : 0.0f;
    ng = p.g[t * nv + hv];
    nb = p.beta[t * nv + hv];
  };
  fetch(0);
  for (int64_t t = 0; t < p.n_tok; ++t) {
    if (loads) {
      q_s[tid] = nq * p.q_scale;
      k_s[tid] = nkk;
    }
    const float decay = expf(ng), beta = nb, v = nv_;
    if (t + 1 < p.n_tok) fetch(t + 1);
    __syncthreads();  // q_s, k_s written
    // S *= exp(g); sk = S^T k
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] *= decay;
      part += k_s[i0 + r] * s[r];
    }
    red_k[tid] = part;
    __syncthreads();  // red_k complete
    float sk = 0.0f;
    for (int ww = 0; ww < W; ++ww) sk += red_k[ww * 32 + lane];
    // delta = beta (v - sk); S += k delta^T; o = S^T q
    const float delta = beta * (v - sk);
    float part_o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] += k_s[i0 + r] * delta;
      part_o += q_s[i0 + r] * s[r];
    }
    red_q[tid] = part_o;
    // red_q complete, and every thread is done with this token's q_s, k_s and red_k: the next
    // token may overwrite them. Warp 0 reads red_q before it reaches the next token's second
    // barrier, the first point where red_q is written again.
    __syncthreads();
    if (w == 0 && col) {
      float o = 0.0f;
      for (int ww = 0; ww < W; ++ww) o += red_q[ww * 32 + lane];
      p.out[t * p.out_stride + hv * d + j] = o;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (col && i0 + r < d) S[(i0 + r) * d + j] = s[r];
}

}  // namespace

bool delta_net_supported(int64_t head_dim, int64_t conv_width) {
  return head_dim >= 1 && head_dim <= kDeltaMaxHeadDim && conv_width >= 1 && conv_width <= kConvMaxWidth;
}

void launch_delta_gates(const DeltaGatesParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.n_k_head > 0 && p.n_v_head % p.n_k_head == 0 ? cudaSuccess : cudaErrorInvalidValue);
  gates_kernel<<<blocks_for(p.n_tok * p.n_v_head, 256), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_conv1d_silu(const ConvParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.width >= 1 && p.width <= kConvMaxWidth && p.x_stride >= p.channels && p.y_stride >= p.channels
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  conv_kernel<<<blocks_for(p.n_tok * p.channels, 256), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
  if (p.width > 1) {
    conv_state_kernel<<<static_cast<unsigned>((p.channels + 255) / 256), 256, 0, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
  }
}

void launch_l2_norm(const L2NormParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.n > 0 ? cudaSuccess : cudaErrorInvalidValue);
  const int64_t rows = p.n_tok * p.n_head;  // 8 warps (rows) per block
  l2_norm_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_delta_rule(const DeltaRuleParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(delta_net_supported(p.d, 1) && p.n_k_head > 0 && p.n_v_head % p.n_k_head == 0
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const int W = static_cast<int>((p.d + kRows - 1) / kRows);  // 1..16 warps
  const dim3 grid(static_cast<unsigned>(p.n_v_head), static_cast<unsigned>((p.d + 31) / 32));
  const size_t smem = static_cast<size_t>(2 * W * kRows + 2 * W * 32) * sizeof(float);
  delta_rule_kernel<<<grid, dim3(32, static_cast<unsigned>(W)), smem, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
