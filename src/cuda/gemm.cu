// Matrix products of prompt-sized batches through cuBLAS (f32 accumulation): F32, F16 and
// BF16 weights as they are, other types dequantized in row tiles to f16 (see matmul.cuh).
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"

namespace frink::cuda::mm {

namespace {

// Rows [r0, r0 + n_rows) of W -> f16 [n_rows][n_in].
template <int T>
__global__ void dequant_f16_kernel(const uint8_t* w, size_t row_bytes, int64_t n_in, int64_t r0, int64_t n_rows,
                                   __half* out) {
  if constexpr (kIsPlain<T>) {
    const int64_t n = n_rows * n_in;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
      const int64_t r = i / n_in, c = i % n_in;
      out[i] = __float2half(plain_at<T>(w + (r0 + r) * row_bytes, c));
    }
  } else {
    const int64_t n_sub = n_in / 32, n = n_rows * n_sub;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
      const int64_t r = i / n_sub, s = i % n_sub;
      float v[32];
      dequant32<T>(w + (r0 + r) * row_bytes, s, v);
      // Four 16-byte stores instead of sixteen 4-byte ones (v1): out is 16-byte aligned here
      // because n_in and the piece offset are multiples of 32 halves.
      alignas(16) __half2 h[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      uint4* o = reinterpret_cast<uint4*>(out + r * n_in + s * 32);
#pragma unroll
      for (int k = 0; k < 4; ++k) o[k] = reinterpret_cast<const uint4*>(h)[k];
    }
  }
}

// x [n_tok][x_stride] -> 16-bit [n_tok][n_in] (__half or __nv_bfloat16), rounded to nearest.
template <typename H>
__global__ void to_16bit_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, H* out) {
  const int64_t n = n_in * n_tok;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[(i / n_in) * x_stride + i % n_in];
    if constexpr (std::is_same_v<H, __half>) out[i] = __float2half_rn(v);
    else out[i] = __float2bfloat16_rn(v);
  }
}

__global__ void bias_scale_kernel(Args a, int64_t n_tok) {
  const int64_t n = a.n_out * n_tok;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / a.n_out, r = i % a.n_out;
    float* y = a.y + t * a.y_stride + r;
    *y = epilogue(a, r, *y);
  }
}

void blas_check(cublasStatus_t st, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) cuda_failed("cublasGemmEx", cublasGetStatusString(st), file, line);
}

}  // namespace

template <int T>
void gemm_launch(const MatmulParams& p, const Args& a, bool x_ready) {
  FRINK_CUDA_CHECK(p.blas ? cudaSuccess : cudaErrorInvalidValue);
  const size_t x_elems = static_cast<size_t>(p.n_in * p.n_tok);
  FRINK_CUDA_CHECK(p.scratch_elems > x_elems + static_cast<size_t>(p.n_in) ? cudaSuccess : cudaErrorInvalidValue);
  __half* xh = static_cast<__half*>(p.scratch);
  __half* wh = xh + x_elems;
  const int64_t tile_rows = std::max<int64_t>(1, static_cast<int64_t>((p.scratch_elems - x_elems) / p.n_in));
  const float one = 1.0f, zero = 0.0f;
  if constexpr (T == kF32) {
    // f32 weights (small checkpoints, test fixtures) as they are, in f32: an f16 copy of
    // weights and activations cost the hf qwen3-next fixture NMSE 7.5e-5 of its 1e-4 budget.
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, CUDA_R_32F, static_cast<int>(p.row_bytes / sizeof(float)),
                            p.x, CUDA_R_32F, static_cast<int>(p.x_stride), &zero, p.y, CUDA_R_32F,
                            static_cast<int>(p.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else if constexpr (T == kF16 || T == kBF16) {
    // 16-bit weights go to cuBLAS as they are: no dequantized copy to write and read back
    // (the quantized types' tiles below), and bf16 keeps its exponent range (an f16 copy of
    // a bf16 weight or activation could overflow). x in the weights' format.
    using H = std::conditional_t<T == kF16, __half, __nv_bfloat16>;
    H* xw = static_cast<H*>(p.scratch);
    if (!x_ready) {  // else the group's previous product left x in this format at the scratch's start
      to_16bit_kernel<H><<<grid_for(static_cast<int64_t>(x_elems), 256), 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in,
                                                                                            p.n_tok, xw);
      FRINK_CUDA_CHECK_LAUNCH();
    }
    const cudaDataType dt = T == kF16 ? CUDA_R_16F : CUDA_R_16BF;
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, dt, static_cast<int>(p.row_bytes / sizeof(H)), xw, dt,
                            static_cast<int>(p.n_in), &zero, p.y, CUDA_R_32F, static_cast<int>(p.y_stride),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else {
    if (!x_ready) {  // else the group's previous product left x in f16 at the scratch's start
      to_16bit_kernel<__half><<<grid_for(static_cast<int64_t>(x_elems), 256), 256, 0, p.stream>>>(p.x, p.x_stride,
                                                                                                  p.n_in, p.n_tok, xh);
      FRINK_CUDA_CHECK_LAUNCH();
    }
    for (int64_t r0 = 0; r0 < p.n_out; r0 += tile_rows) {
      const int64_t nr = std::min(tile_rows, p.n_out - r0);
      const int64_t work = kIsPlain<T> ? nr * p.n_in : nr * (p.n_in / 32);
      dequant_f16_kernel<T><<<grid_for(work, 256), 256, 0, p.stream>>>(a.w, p.row_bytes, p.n_in, r0, nr, wh);
      FRINK_CUDA_CHECK_LAUNCH();
      // Column-major view: W rows are columns of a [n_in x nr] matrix; C = W^T X is [nr x n_tok]
      // with leading dimension y_stride, i.e. Y[t][r0 + r].
      blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr), static_cast<int>(p.n_tok),
                              static_cast<int>(p.n_in), &one, wh, CUDA_R_16F, static_cast<int>(p.n_in), xh, CUDA_R_16F,
                              static_cast<int>(p.n_in), &zero, p.y + r0, CUDA_R_32F, static_cast<int>(p.y_stride),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 __FILE__, __LINE__);
    }
  }
  if (p.bias || p.scale != 1.0f) {
    bias_scale_kernel<<<grid_for(p.n_out * p.n_tok, 256), 256, 0, p.stream>>>(a, p.n_tok);
    FRINK_CUDA_CHECK_LAUNCH();
  }
}


#define FRINK_INST(T) template void gemm_launch<T>(const MatmulParams&, const Args&, bool);
FRINK_FOR_EACH_DEVICE_TYPE(FRINK_INST)
#undef FRINK_INST

}  // namespace frink::cuda::mm
