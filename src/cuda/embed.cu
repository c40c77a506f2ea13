#include "cuda/embed.cuh"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"
#include "cuda/matmul.cuh"

namespace frink::cuda {

namespace {

template <int T>
__global__ void embed_row_kernel(const uint8_t* w, size_t row_bytes, int64_t n, float scale, const int32_t* id,
                                 float* x) {
  // An undecided draw's -1 (pick.cuh) reaches the step enqueued behind it, which is dropped:
  // any row will do there, but not one outside the table.
  const uint8_t* row = w + static_cast<int64_t>(max(*id, 0)) * row_bytes;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if constexpr (kIsPlain<T>) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
      const float v = plain_at<T>(row, i);
      x[i] = scale > 0.0f ? v * scale : v;
    }
  } else {
    for (int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; s < n / 32; s += stride) {
      float v[32];
      dequant32<T>(row, s, v);
#pragma unroll
      for (int k = 0; k < 32; ++k) x[32 * s + k] = scale > 0.0f ? v[k] * scale : v[k];
    }
  }
}

}  // namespace

void launch_embed_row(const EmbedParams& p) {
  const int64_t work = p.n;  // a thread an element (plain) or a 32-element piece: a few blocks at most
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, 64));
  const auto* w = static_cast<const uint8_t*>(p.w);
#define FRINK_CASE(T)                                                                          \
  if (p.type == T) {                                                                           \
    embed_row_kernel<T><<<blocks, 256, 0, p.stream>>>(w, p.row_bytes, p.n, p.scale, p.id, p.x); \
    FRINK_CUDA_CHECK_LAUNCH();                                                                 \
    return;                                                                                    \
  }
  FRINK_FOR_EACH_DEVICE_TYPE(FRINK_CASE)
#undef FRINK_CASE
  FRINK_CUDA_CHECK(cudaErrorInvalidValue);  // no decoder: the caller skipped matmul_supported
}

}  // namespace frink::cuda
