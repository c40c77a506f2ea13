#include "cuda/elementwise.cuh"

#include <algorithm>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 20)); }

__device__ __forceinline__ float act(float v, bool gelu) {
  if (!gelu) return v / (1.0f + expf(-v));
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * v * (1.0f + 0.044715f * v * v)));
}

__global__ void glu_kernel(GluParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n * p.n_tok; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.n, j = i % p.n;
    const float g = act(p.gate[t * p.gate_stride + j], p.gelu);
    p.out[i] = p.up ? g * p.up[t * p.up_stride + j] : g;
  }
}

__global__ void add_kernel(float* y, const float* a, const float* b, const float* c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = c ? a[i] + (b[i] + c[i]) : a[i] + b[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

}  // namespace

void launch_glu(const GluParams& p) {
  if (p.n * p.n_tok == 0) return;
  glu_kernel<<<blocks_for(p.n * p.n_tok), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_add(float* y, const float* a, const float* b, const float* c, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), 256, 0, stream>>>(y, a, b, c, n);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  softcap_kernel<<<blocks_for(n), 256, 0, stream>>>(x, n, cap);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
