// The host's f16 / bf16 activation rounding (round to nearest even, kept as f32), written once
// for every kernel that writes an F16 / BF16 product's rounded input (act_prep.cu's round and
// fused producers, attention.cu's merge): a product's input rounded by any of them must be the
// same bits. Only for .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace frink::cuda {

__device__ __forceinline__ float round16(float v, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

// The rounding stored as O: f32 holding the rounded value (the matrix-vector kernels read x
// so), or the 16-bit value itself (__half / __nv_bfloat16: cuBLAS's x, gemm.cu), whose format
// O names (bf16 must agree).
template <typename O>
__device__ __forceinline__ O store16(float v, bool bf16) {
  if constexpr (std::is_same_v<O, __half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<O, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return round16(v, bf16);
}

}  // namespace frink::cuda
