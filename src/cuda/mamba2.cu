#include "cuda/mamba2.cuh"

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/norm_row.cuh"

namespace frink::cuda {

namespace {

constexpr int kScanWarps = 4;
constexpr int kNormThreads = 256;

// ggml's softplus: x itself above 20, where log(1 + e^x) rounds to it in f32.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Warp (row = h * head_dim + p) of the grid: its d_state floats of state in registers, lane j
// holding i = j + 32 k, over the tokens in order.
template <int kPer>
__global__ void __launch_bounds__(kScanWarps * 32) mamba2_scan_kernel(Mamba2ScanParams p) {
  const int64_t P = p.head_dim, DI = p.n_head * P, N = p.d_state;
  const int64_t row = blockIdx.x * int64_t{kScanWarps} + threadIdx.x / 32;
  if (row >= DI) return;  // warp-uniform
  const int lane = threadIdx.x % 32;
  const int64_t h = row / P, g = h / (p.n_head / p.n_group);
  const float* src = p.state + row * N;
  float* dst = (p.state_out ? p.state_out : p.state) + row * N;
  float s[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) s[k] = lane + 32 * k < N ? src[lane + 32 * k] : 0.0f;
  const float a = p.a[h], dt_b = p.dt_bias[h], d = p.d[h];
  for (int64_t t = 0; t < p.n_tok; ++t) {
    const float* xt = p.xbc + t * p.xbc_stride;
    const float* zt = p.zdt + t * p.zdt_stride;
    const float dt = softplus(zt[p.dt_off + h] + dt_b);
    const float dA = expf(dt * a);
    const float x = xt[row], x_dt = x * dt;
    const float* B = xt + DI + g * N;
    const float* C = xt + DI + p.n_group * N + g * N;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = lane + 32 * k;
      if (i < N) {
        const float v = s[k] * dA + B[i] * x_dt;
        sum += v * C[i];
        s[k] = v;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const float z = zt[row], v = sum + x * d;
      p.y[t * DI + row] = z / (1.0f + expf(-z)) * v;
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (lane + 32 * k < N) dst[lane + 32 * k] = s[k];
}

// grid (n_group, n_tok): one group of one row.
__global__ void __launch_bounds__(kNormThreads) group_rms_norm_kernel(GroupNormParams p) {
  __shared__ float shared[32];
  const int64_t gw = p.width / p.n_group, g = blockIdx.x;
  float* y = p.y + blockIdx.y * p.width + g * gw;
  const float* w = p.w + g * gw;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < gw; i += blockDim.x) ss += y[i] * y[i];
  const float scale = rsqrtf(block_sum(ss, shared) / static_cast<float>(gw) + p.eps);
  for (int64_t i = threadIdx.x; i < gw; i += blockDim.x) y[i] = y[i] * scale * w[i];
}

}  // namespace

bool mamba2_supported(int64_t d_state) { return d_state > 0 && d_state <= kMamba2MaxState; }

void launch_mamba2_scan(const Mamba2ScanParams& p) {
  FRINK_CUDA_CHECK(mamba2_supported(p.d_state) && p.n_group > 0 && p.n_head % p.n_group == 0 && p.head_dim > 0
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  if (p.n_tok == 0) return;
  const int64_t rows = p.n_head * p.head_dim;
  const unsigned blocks = static_cast<unsigned>((rows + kScanWarps - 1) / kScanWarps);
  if (p.d_state <= 64) mamba2_scan_kernel<2><<<blocks, kScanWarps * 32, 0, p.stream>>>(p);
  else if (p.d_state <= 128) mamba2_scan_kernel<4><<<blocks, kScanWarps * 32, 0, p.stream>>>(p);
  else mamba2_scan_kernel<8><<<blocks, kScanWarps * 32, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_group_rms_norm(const GroupNormParams& p) {
  FRINK_CUDA_CHECK(p.n_group > 0 && p.width % p.n_group == 0 && p.w ? cudaSuccess : cudaErrorInvalidValue);
  if (p.n_tok == 0) return;
  group_rms_norm_kernel<<<dim3(static_cast<unsigned>(p.n_group), static_cast<unsigned>(p.n_tok)), kNormThreads, 0,
                          p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
