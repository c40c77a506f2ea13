// RMSNorm and LayerNorm over rows on the device (the host bodies: cpu::rms_norm,
// cpu::layer_norm). Also serves QK-norm: rows = n_tok * n_head heads of head_dim.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

struct NormParams {
  const float* x = nullptr;  // [n_rows][x_stride]
  int64_t x_stride = 0;
  float* y = nullptr;        // [n_rows][y_stride]; may equal x
  int64_t y_stride = 0;
  int64_t n = 0, n_rows = 0;
  const float* w = nullptr;  // [n] or null
  const float* b = nullptr;  // [n] or null (LayerNorm only)
  float eps = 0.0f;
  bool layer_norm = false;   // false: RMSNorm
  // [n_rows][y_stride] or null: y = residual + norm(x), a sandwich norm (gemma's post-attention
  // and post-FFN norms) and the residual add in one launch; may equal y. Bit for bit the norm
  // then launch_add (x + o == o + x).
  const float* residual = nullptr;
  cudaStream_t stream = nullptr;
};

void launch_norm(const NormParams& p);
// a then b in one launch when both take the vector body at one width (a layer's per-head q
// and k norms: one kernel fewer per layer), else two launches; the same results either way.
void launch_norm_pair(const NormParams& a, const NormParams& b);

}  // namespace frink::cuda
