// Matrix products of prompt-sized batches through cuBLAS (f32 accumulation): F32, F16 and
// BF16 weights as they are, other types dequantized in row tiles to f16 (see matmul.cuh).
#include <atomic>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"

namespace frink::cuda::mm {

namespace {

// Rows in an x8 layout (whole groups or tiles: x8_type) -> f16 [n_rows][n_in], a thread per 8
// elements (dequant8_x8: one 8-byte quant load) over row_grid(n_in / 8, n_rows), one 16-byte
// store, so a warp writes 512 contiguous bytes; the values dequant_f16_kernel's. Why: that
// kernel (a thread per 32-element block, byte loads, a warp's stores 64 bytes apart) ran at
// about 1 TB/s, 9.8 ms of an 8B Q4_0 pp512 batch's 30 ms of kernels (H200 ncu).
template <int T>
__global__ void dequant_x8_f16_kernel(const uint8_t* w, size_t row_bytes, int64_t n_in, int64_t r0, int64_t n_rows,
                                      __half* out) {
  const int64_t n8 = n_in / 8;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y)
    for (int64_t u = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; u < n8; u += int64_t{gridDim.x} * blockDim.x) {
      float v[8];
      dequant8_x8<T>(w + (r0 + r) * row_bytes, u, v);
      alignas(16) __half2 h[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      reinterpret_cast<uint4*>(out + r * n_in)[u] = *reinterpret_cast<const uint4*>(h);
    }
}

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

__global__ void bias_scale_kernel(Args a, int64_t n_tok) {
  const int64_t n = a.n_out * n_tok;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / a.n_out, r = i % a.n_out;
    float* y = a.y + t * a.y_stride + r;
    *y = epilogue(a, r, *y);
  }
}

// x [n_tok][n_in] in 16 bits (H) at the scratch's start, converted there unless x_ready (the
// group's previous product left it so).
template <typename H>
H* x_16bit(const MatmulParams& p, bool x_ready) {
  H* xw = static_cast<H*>(p.scratch);
  if (!x_ready) {
    launch_x_16bit(p, std::is_same_v<H, __nv_bfloat16>, xw);
  }
  return xw;
}

// Rows [r0, r0 + n_rows) of W (rows of row_bytes, n_in wide) -> f16 [n_rows][n_in] at out.
template <int T>
void dequant_rows(const MatmulParams& p, const uint8_t* w, int64_t r0, int64_t n_rows, __half* out) {
  if constexpr (kIsX8<T>) {  // rows of whole groups or tiles (x8_type): 16-byte aligned
    dequant_x8_f16_kernel<T><<<row_grid(p.n_in / 8, n_rows), 256, 0, p.stream>>>(w, p.row_bytes, p.n_in, r0, n_rows, out);
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t work = kIsPlain<T> ? n_rows * p.n_in : n_rows * (p.n_in / 32);
  dequant_f16_kernel<T><<<grid_for(work, 256), 256, 0, p.stream>>>(w, p.row_bytes, p.n_in, r0, n_rows, out);
  FRINK_CUDA_CHECK_LAUNCH();
}

void blas_check(cublasStatus_t st, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) cuda_failed("cublasGemmEx", cublasGetStatusString(st), file, line);
}

// Streams (each with its own cuBLAS handle: one handle's workspace must not serve two streams
// at once) for the per-expert calls below, which are small and latency-bound (qwen3-30b-a3b
// pp512: ~30 rows an expert, 5-8 us a kernel, H200 ncu): kFanout of them run at once. Made on
// first use for the current device and kept for the process (destroying them at exit could
// follow the driver's own teardown).
constexpr int kFanout = 8;
struct Fanout {
  cudaStream_t stream[kFanout];
  cublasHandle_t blas[kFanout];
  cudaEvent_t done[kFanout];
  cudaEvent_t start;
};
Fanout& fanout() {
  static Fanout f = [] {
    Fanout g;
    for (int i = 0; i < kFanout; ++i) {
      FRINK_CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream[i], cudaStreamNonBlocking));
      FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&g.done[i], cudaEventDisableTiming));
      blas_check(cublasCreate(&g.blas[i]), __FILE__, __LINE__);
      blas_check(cublasSetStream(g.blas[i], g.stream[i]), __FILE__, __LINE__);
    }
    FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&g.start, cudaEventDisableTiming));
    return g;
  }();
  return f;
}

// C_i = A_i^T B_i for the experts i of one call (m = p.n_out, n = rows[i], k = p.n_in; A_i the
// expert's rows of lda elements, B_i its x rows of ldb, C_i its y rows), f32
// out, as one cublasGemmGroupedBatchedEx (a group per expert); its pointer arrays go to dptrs
// (device, 3 x experts). Where that call is not supported (a cuBLAS before 12.5's grouped
// calls, a type pair it lacks: cuBLAS 13 on the H200 refuses f16 in, f32 out) each expert is a
// cublasGemmEx, spread over the fan-out streams: the same products, more launches.
std::atomic<bool> grouped_calls{true};
// (n experts: A, B, C and rows point at n entries each; CUDA files are C++17, no std::span.)
void grouped_gemm(const MatmulParams& p, int n, const void* const* A, const void* const* B, void* const* C,
                  const int* rows, int lda, int ldb, cudaDataType t, void** dptrs) {
  if (n == 0) return;
  const float one = 1.0f, zero = 0.0f;
  if (grouped_calls.load(std::memory_order_relaxed)) {
    std::vector<const void*> ptrs(A, A + n);
    ptrs.insert(ptrs.end(), B, B + n);
    ptrs.insert(ptrs.end(), C, C + n);
    // Pageable source: staged before the call returns, and ordered on the stream after the
    // products that read earlier arrays.
    FRINK_CUDA_CHECK(cudaMemcpyAsync(dptrs, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, p.stream));
    const std::vector<cublasOperation_t> ta(n, CUBLAS_OP_T), tb(n, CUBLAS_OP_N);
    const std::vector<int> m(n, static_cast<int>(p.n_out)), k(n, static_cast<int>(p.n_in)), la(n, lda), lb(n, ldb),
        lc(n, static_cast<int>(p.y_stride)), size(n, 1);
    const std::vector<float> alpha(n, 1.0f), beta(n, 0.0f);
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        p.blas, ta.data(), tb.data(), m.data(), rows, k.data(), alpha.data(), dptrs, t, la.data(), dptrs + n, t,
        lb.data(), beta.data(), reinterpret_cast<void* const*>(dptrs + 2 * n), CUDA_R_32F, lc.data(), n, size.data(),
        CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
      blas_check(st, __FILE__, __LINE__);
      return;
    }
    grouped_calls.store(false, std::memory_order_relaxed);
  }
  Fanout& f = fanout();
  const int used = std::min(n, kFanout);
  FRINK_CUDA_CHECK(cudaEventRecord(f.start, p.stream));
  for (int j = 0; j < used; ++j) FRINK_CUDA_CHECK(cudaStreamWaitEvent(f.stream[j], f.start));
  for (int i = 0; i < n; ++i)
    blas_check(cublasGemmEx(f.blas[i % kFanout], CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), rows[i],
                            static_cast<int>(p.n_in), &one, A[i], t, lda, B[i], t, ldb, &zero, C[i], CUDA_R_32F,
                            static_cast<int>(p.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  for (int j = 0; j < used; ++j) {
    FRINK_CUDA_CHECK(cudaEventRecord(f.done[j], f.stream[j]));
    FRINK_CUDA_CHECK(cudaStreamWaitEvent(p.stream, f.done[j]));
  }
}

// MatmulParams::group_rows: expert e's rows of x times expert e's matrix.
// F32, F16 and BF16 experts as they are (x as f32, or in their 16-bit format), one call; other
// types' experts dequantized to f16 in runs of consecutive experts that fit the scratch after
// x's f16 copy, one call per run.
template <int T>
void gemm_grouped(const MatmulParams& p, bool x_ready) {
  FRINK_CUDA_CHECK(p.group_ptrs && p.n_expert > 0 && !p.bias && p.scale == 1.0f &&
                           !p.residual && !p.slot_expert && !p.expert_scale &&
                           p.expert_bytes == p.row_bytes * static_cast<size_t>(p.n_out)
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const auto* w = static_cast<const uint8_t*>(p.w);
  const size_t x_elems = static_cast<size_t>(p.n_in * p.n_tok);
  constexpr bool plain16 = T == kF16 || T == kBF16;
  const cudaDataType t = T == kF32 ? CUDA_R_32F : T == kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  const size_t esize = T == kF32 ? sizeof(float) : 2;
  const void* xb = p.x;
  int ldb = static_cast<int>(p.x_stride);
  if constexpr (T != kF32) {
    xb = x_16bit<std::conditional_t<T == kBF16, __nv_bfloat16, __half>>(p, x_ready);
    ldb = static_cast<int>(p.n_in);
  }
  std::vector<const void*> A, B;
  std::vector<void*> C;
  std::vector<int> rows;
  std::vector<int64_t> first(static_cast<size_t>(p.n_expert));  // each expert's first row
  for (int64_t e = 0, r = 0; e < p.n_expert; r += p.group_rows[e], ++e) first[static_cast<size_t>(e)] = r;
  const auto add = [&](int64_t e, const void* a) {
    const int64_t r = first[static_cast<size_t>(e)];
    rows.push_back(p.group_rows[e]);
    A.push_back(a);
    B.push_back(static_cast<const uint8_t*>(xb) + static_cast<size_t>(r * ldb) * esize);
    C.push_back(p.y + r * p.y_stride);
  };
  if constexpr (T == kF32 || plain16) {
    for (int64_t e = 0; e < p.n_expert; ++e)
      if (p.group_rows[e] > 0) add(e, w + static_cast<size_t>(e) * p.expert_bytes);
    grouped_gemm(p, static_cast<int>(A.size()), A.data(), B.data(), C.data(), rows.data(),
                 static_cast<int>(p.row_bytes / esize), ldb, t, p.group_ptrs);
  } else {
    __half* wh = static_cast<__half*>(p.scratch) + x_elems;
    const size_t per = static_cast<size_t>(p.n_out * p.n_in);
    FRINK_CUDA_CHECK(p.scratch_elems >= x_elems + per ? cudaSuccess : cudaErrorInvalidValue);
    const int64_t run_max = static_cast<int64_t>((p.scratch_elems - x_elems) / per);
    size_t done = 0;  // experts already called
    for (int64_t e0 = 0; e0 < p.n_expert;) {
      while (e0 < p.n_expert && p.group_rows[e0] == 0) ++e0;  // a run starts at an expert with rows
      if (e0 == p.n_expert) break;
      int64_t e1 = e0;
      for (int64_t e = e0; e < std::min(p.n_expert, e0 + run_max); ++e)
        if (p.group_rows[e] > 0) e1 = e + 1;
      dequant_rows<T>(p, w, e0 * p.n_out, (e1 - e0) * p.n_out, wh);
      for (int64_t e = e0; e < e1; ++e)
        if (p.group_rows[e] > 0) add(e, wh + static_cast<size_t>(e - e0) * per);
      grouped_gemm(p, static_cast<int>(A.size() - done), A.data() + done, B.data() + done, C.data() + done,
                   rows.data() + done, static_cast<int>(p.n_in), ldb, t, p.group_ptrs + 3 * done);
      done = A.size();
      e0 = e1;
    }
  }
}

// MatmulParams::head_batch: C_h = W_h^T X_h for every head h in one strided-batched call, X_h
// the rows [t * H + h] (of x's f16 copy, or of x itself for F32), C_h those of y. Why: slot
// products (a matrix-vector product a token and head) read each head's matrix once a row, and
// took 1.05 ms of a 512-token batch's latent layer for wv_b alone (8192 slots, H200 ncu).
template <int T>
void gemm_heads(const MatmulParams& p, bool x_ready) {
  const int64_t H = p.head_batch, n = p.n_tok / H;
  FRINK_CUDA_CHECK(!p.bias && p.scale == 1.0f && !p.residual && !p.expert_scale &&
                           p.expert_bytes == p.row_bytes * static_cast<size_t>(p.n_out)
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const float one = 1.0f, zero = 0.0f;
  const auto call = [&](const void* A, cudaDataType t, int lda, long long stride_a, const void* B, int ldb,
                        long long stride_b) {
    blas_check(cublasGemmStridedBatchedEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out),
                                          static_cast<int>(n), static_cast<int>(p.n_in), &one, A, t, lda, stride_a, B,
                                          t, ldb, stride_b, &zero, p.y, CUDA_R_32F, static_cast<int>(H * p.y_stride),
                                          static_cast<long long>(p.y_stride), static_cast<int>(H), CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  };
  const long long per_head = static_cast<long long>(p.expert_bytes);  // bytes a head's matrix
  if constexpr (T == kF32) {
    constexpr long long f = sizeof(float);
    call(p.w, CUDA_R_32F, static_cast<int>(p.row_bytes / f), per_head / f, p.x, static_cast<int>(H * p.x_stride),
         static_cast<long long>(p.x_stride));
  } else if constexpr (T == kF16 || T == kBF16) {
    using X = std::conditional_t<T == kF16, __half, __nv_bfloat16>;
    constexpr long long f = sizeof(X);
    const X* xw = x_16bit<X>(p, x_ready);
    call(p.w, T == kF16 ? CUDA_R_16F : CUDA_R_16BF, static_cast<int>(p.row_bytes / f), per_head / f, xw,
         static_cast<int>(H * p.n_in), static_cast<long long>(p.n_in));
  } else {
    const size_t x_elems = static_cast<size_t>(p.n_in * p.n_tok), w_elems = static_cast<size_t>(H * p.n_out * p.n_in);
    FRINK_CUDA_CHECK(p.scratch_elems >= x_elems + w_elems ? cudaSuccess : cudaErrorInvalidValue);
    const __half* xh = x_16bit<__half>(p, x_ready);
    __half* wh = static_cast<__half*>(p.scratch) + x_elems;
    dequant_rows<T>(p, static_cast<const uint8_t*>(p.w), 0, H * p.n_out, wh);
    call(wh, CUDA_R_16F, static_cast<int>(p.n_in), static_cast<long long>(p.n_out * p.n_in), xh,
         static_cast<int>(H * p.n_in), static_cast<long long>(p.n_in));
  }
}

}  // namespace

template <int T>
void gemm_launch(const MatmulParams& p, const Args& a, bool x_ready) {
  FRINK_CUDA_CHECK(p.blas ? cudaSuccess : cudaErrorInvalidValue);
  if (p.group_rows) {
    gemm_grouped<T>(p, x_ready);
    return;
  }
  if (p.head_batch) {
    gemm_heads<T>(p, x_ready);
    return;
  }
  const size_t x_elems = static_cast<size_t>(p.n_in * p.n_tok);
  FRINK_CUDA_CHECK(p.scratch_elems > x_elems + static_cast<size_t>(p.n_in) ? cudaSuccess : cudaErrorInvalidValue);
  __half* xh = static_cast<__half*>(p.scratch);
  __half* wh = xh + x_elems;
  const int64_t tile_rows = std::max<int64_t>(1, static_cast<int64_t>((p.scratch_elems - x_elems) / p.n_in));
  // y = residual + W x where the caller asks (matmul_adds_residual: in place, no epilogue after):
  // cuBLAS adds y's old values through beta, where an add kernel was a pass over x, o and x again
  // (10.4 us a launch, 0.67 ms of an 8B BF16 pp512 batch, H200 ncu).
  FRINK_CUDA_CHECK(!p.residual || (p.residual == p.y && !p.bias && p.scale == 1.0f) ? cudaSuccess : cudaErrorInvalidValue);
  const float one = 1.0f, beta = p.residual ? 1.0f : 0.0f;
  if constexpr (T == kF32) {
    // f32 weights (small checkpoints, test fixtures) as they are, in f32: an f16 copy of
    // weights and activations cost the hf qwen3-next fixture NMSE 7.5e-5 of its 1e-4 budget.
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, CUDA_R_32F, static_cast<int>(p.row_bytes / sizeof(float)),
                            p.x, CUDA_R_32F, static_cast<int>(p.x_stride), &beta, p.y, CUDA_R_32F,
                            static_cast<int>(p.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else if constexpr (T == kF16 || T == kBF16) {
    // 16-bit weights go to cuBLAS as they are: no dequantized copy to write and read back
    // (the quantized types' tiles below), and bf16 keeps its exponent range (an f16 copy of
    // a bf16 weight or activation could overflow). x in the weights' format.
    using H = std::conditional_t<T == kF16, __half, __nv_bfloat16>;
    const H* xw = x_16bit<H>(p, x_ready);
    const cudaDataType dt = T == kF16 ? CUDA_R_16F : CUDA_R_16BF;
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, dt, static_cast<int>(p.row_bytes / sizeof(H)), xw, dt,
                            static_cast<int>(p.n_in), &beta, p.y, CUDA_R_32F, static_cast<int>(p.y_stride),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else {
    x_16bit<__half>(p, x_ready);  // xh
    for (int64_t r0 = 0; r0 < p.n_out; r0 += tile_rows) {
      const int64_t nr = std::min(tile_rows, p.n_out - r0);
      dequant_rows<T>(p, static_cast<const uint8_t*>(a.w), r0, nr, wh);
      // Column-major view: W rows are columns of a [n_in x nr] matrix; C = W^T X is [nr x n_tok]
      // with leading dimension y_stride, i.e. Y[t][r0 + r].
      blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr), static_cast<int>(p.n_tok),
                              static_cast<int>(p.n_in), &one, wh, CUDA_R_16F, static_cast<int>(p.n_in), xh, CUDA_R_16F,
                              static_cast<int>(p.n_in), &beta, p.y + r0, CUDA_R_32F, static_cast<int>(p.y_stride),
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

namespace frink::cuda {
bool gemm_grouped_calls() { return mm::grouped_calls.load(std::memory_order_relaxed); }
}  // namespace frink::cuda
