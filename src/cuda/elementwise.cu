#include "cuda/elementwise.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/glu_value.cuh"
#include "cuda/pdl.cuh"

namespace frink::cuda {

namespace {

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 20)); }

__global__ void glu_kernel(GluParams p) {  // row_grid
  for (int64_t t = blockIdx.y; t < p.n_tok; t += gridDim.y)
    for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < p.n; e += int64_t{gridDim.x} * blockDim.x)
      p.out[t * p.n + e] = glu_value(p, t, e);
}

// A block of 256 elements of one token (glu_norm_value's layout).
__global__ void __launch_bounds__(256) glu_norm_kernel(GluParams p) {
  const int64_t t = blockIdx.y, e = int64_t{blockIdx.x} * 256 + threadIdx.x;
  p.out[t * p.n + e] = glu_norm_value(p, t, e);
}

__global__ void add_kernel(float* y, const float* a, const float* b, const float* c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = c ? a[i] + (b[i] + c[i]) : a[i] + b[i];
}

__global__ void sigmoid_mul_kernel(float* x, const float* gate, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

// (value, index) pairs: the larger value wins, the lower index on equal values.
__device__ __forceinline__ void argmax_merge(float& v, int32_t& i, float v2, int32_t i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// Reduces (v, i) over the block (256 threads) into thread 0's (v, i).
__device__ __forceinline__ void argmax_block(float& v, int32_t& i) {
  __shared__ float s_v[8];
  __shared__ int32_t s_i[8];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) argmax_merge(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < 8 ? s_v[lane] : -INFINITY;
    i = lane < 8 ? s_i[lane] : INT32_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      argmax_merge(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  }
}

// Pass 1: block b scans x[j] for j = b * 256 + t, stepping the whole grid; -inf and index
// INT32_MAX stand for "nothing yet", so any real logit (or -inf at a real index) wins.
__global__ void __launch_bounds__(256) argmax_partial_kernel(const float* x, int64_t n, float* part_v,
                                                             int32_t* part_i) {
  grid_dependents_launch();  // the final pass may launch now, and wait
  float v = -INFINITY;
  int32_t i = INT32_MAX;
  for (int64_t j = blockIdx.x * int64_t{256} + threadIdx.x; j < n; j += int64_t{gridDim.x} * 256)
    argmax_merge(v, i, x[j], static_cast<int32_t>(j));
  argmax_block(v, i);
  if (threadIdx.x == 0) {
    part_v[blockIdx.x] = v;
    part_i[blockIdx.x] = i;
  }
}

__global__ void __launch_bounds__(256)
    argmax_final_kernel(const float* part_v, const int32_t* part_i, int32_t* out, int32_t* advance) {
  dependent_kernel_start();
  float v = -INFINITY;
  int32_t i = INT32_MAX;
  for (int j = threadIdx.x; j < kArgmaxBlocks; j += 256) argmax_merge(v, i, part_v[j], part_i[j]);
  argmax_block(v, i);
  if (threadIdx.x == 0) {
    *out = i == INT32_MAX ? 0 : i;  // all -inf or empty: id 0, as max_element
    if (advance) ++*advance;
  }
}

}  // namespace

size_t argmax_scratch_bytes() { return kArgmaxBlocks * (sizeof(float) + sizeof(int32_t)); }

void launch_argmax(const float* x, int64_t n, void* scratch, int32_t* out, cudaStream_t stream, int32_t* advance) {
  FRINK_CUDA_CHECK(n > 0 && n <= INT32_MAX ? cudaSuccess : cudaErrorInvalidValue);
  float* part_v = static_cast<float*>(scratch);
  int32_t* part_i = reinterpret_cast<int32_t*>(part_v + kArgmaxBlocks);
  argmax_partial_kernel<<<kArgmaxBlocks, 256, 0, stream>>>(x, n, part_v, part_i);
  FRINK_CUDA_CHECK_LAUNCH();
  launch_dependent(argmax_final_kernel, 1, 256, 0, stream, part_v, part_i, out, advance);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_glu(const GluParams& p) {
  if (p.n * p.n_tok == 0) return;
  if (p.up_norm_w) {
    FRINK_CUDA_CHECK(glu_norm_ok(p) && p.n_tok <= 65535 ? cudaSuccess : cudaErrorInvalidValue);  // grid y
    glu_norm_kernel<<<dim3(static_cast<unsigned>(p.n / 256), static_cast<unsigned>(p.n_tok)), 256, 0, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  glu_kernel<<<row_grid(p.n, p.n_tok), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_add(float* y, const float* a, const float* b, const float* c, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), 256, 0, stream>>>(y, a, b, c, n);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_sigmoid_mul(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_mul_kernel<<<blocks_for(n), 256, 0, stream>>>(x, gate, n);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  softcap_kernel<<<blocks_for(n), 256, 0, stream>>>(x, n, cap);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
