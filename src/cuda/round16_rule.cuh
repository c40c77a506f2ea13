// The host's f16 / bf16 activation rounding (round to nearest even, kept as f32), written once
// for every kernel that writes an F16 / BF16 product's rounded input (act_prep.cu's round and
// fused producers, attention.cu's merge): a product's input rounded by any of them must be the
// same bits. Only for .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace frink::cuda {

__device__ __forceinline__ float round16(float v, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

}  // namespace frink::cuda
