// Q4_0 rows reordered for the device (matmul.cuh: q4_0_x8_type, repack_q4_0_x8).
#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"
#include "cuda/matmul.cuh"

namespace frink::cuda {

namespace {

constexpr int kGroupBytes = BlockGeom<kQ4_0X8>::kBytes;  // 8 blocks of 18 bytes
static_assert(kGroupBytes == 8 * BlockGeom<kQ4_0>::kBytes && kGroupBytes % 16 == 0, "groups stay 16-byte aligned");

// One thread per group: its 144 bytes (9 aligned 16-byte words, the group starting 144 g
// from a 16-byte aligned base) read, reordered in registers and written back in place. Block
// k (18 bytes: f16 d, 16 bytes of quants) gives quants [16 k, 16 k + 16) and d at 128 + 2 k.
__global__ void repack_q4_0_x8_kernel(uint8_t* w, int64_t n_groups) {
  const int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (g >= n_groups) return;
  uint4* p = reinterpret_cast<uint4*>(w + g * kGroupBytes);
  uint4 in[9], out[9];
#pragma unroll
  for (int i = 0; i < 9; ++i) in[i] = p[i];
  const uint8_t* b = reinterpret_cast<const uint8_t*>(in);
  uint8_t* o = reinterpret_cast<uint8_t*>(out);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
#pragma unroll
    for (int i = 0; i < 16; ++i) o[16 * k + i] = b[18 * k + 2 + i];
    o[128 + 2 * k] = b[18 * k];
    o[129 + 2 * k] = b[18 * k + 1];
  }
#pragma unroll
  for (int i = 0; i < 9; ++i) p[i] = out[i];
}

}  // namespace

int q4_0_x8_type(int type, int64_t n_in) {
  return type == kQ4_0 && n_in % BlockGeom<kQ4_0X8>::kElems == 0 ? kQ4_0X8 : type;
}

void repack_q4_0_x8(void* w, size_t n_bytes, cudaStream_t stream) {
  FRINK_CUDA_CHECK(n_bytes % kGroupBytes == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 ? cudaSuccess
                                                                                          : cudaErrorInvalidValue);
  const auto n_groups = static_cast<int64_t>(n_bytes / kGroupBytes);
  if (n_groups == 0) return;
  constexpr int kThreads = 256;
  repack_q4_0_x8_kernel<<<static_cast<unsigned>((n_groups + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(w), n_groups);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
