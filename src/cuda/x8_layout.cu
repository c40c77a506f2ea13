// Q4_0 and Q8_0 rows reordered for the device (matmul.cuh: x8_type, repack_x8).
#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"
#include "cuda/matmul.cuh"

namespace frink::cuda {

namespace {

// One thread per group of 8 blocks of B bytes (an f16 d, then B - 2 bytes of quants): the
// group's 8 B bytes (16-byte words, the group starting 8 B g from a 16-byte aligned base) read,
// reordered in registers and written back in place. Block k's quants go to [(B - 2) k,
// (B - 2)(k + 1)), its d to 8 (B - 2) + 2 k.
template <int B>
__global__ void repack_x8_kernel(uint8_t* w, int64_t n_groups) {
  constexpr int kGroup = 8 * B, kWords = kGroup / 16, kQuants = B - 2;
  static_assert(kGroup % 16 == 0, "groups stay 16-byte aligned");
  const int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (g >= n_groups) return;
  uint4* p = reinterpret_cast<uint4*>(w + g * kGroup);
  uint4 in[kWords], out[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) in[i] = p[i];
  const uint8_t* b = reinterpret_cast<const uint8_t*>(in);
  uint8_t* o = reinterpret_cast<uint8_t*>(out);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
#pragma unroll
    for (int i = 0; i < kQuants; ++i) o[kQuants * k + i] = b[B * k + 2 + i];
    o[8 * kQuants + 2 * k] = b[B * k];
    o[8 * kQuants + 2 * k + 1] = b[B * k + 1];
  }
#pragma unroll
  for (int i = 0; i < kWords; ++i) p[i] = out[i];
}

}  // namespace

int x8_type(int type, int64_t n_in) {
  if (n_in % 256 != 0) return type;
  return type == kQ4_0 ? kQ4_0X8 : type == kQ8_0 ? kQ8_0X8 : type;
}

void repack_x8(int type, void* w, size_t n_bytes, cudaStream_t stream) {
  const int group = type == kQ4_0 ? BlockGeom<kQ4_0X8>::kBytes : type == kQ8_0 ? BlockGeom<kQ8_0X8>::kBytes : 0;
  FRINK_CUDA_CHECK(group > 0 && n_bytes % group == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const auto n_groups = static_cast<int64_t>(n_bytes / group);
  if (n_groups == 0) return;
  constexpr int kThreads = 256;
  const auto grid = static_cast<unsigned>((n_groups + kThreads - 1) / kThreads);
  if (type == kQ4_0) repack_x8_kernel<BlockGeom<kQ4_0>::kBytes><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), n_groups);
  else repack_x8_kernel<BlockGeom<kQ8_0>::kBytes><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), n_groups);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
