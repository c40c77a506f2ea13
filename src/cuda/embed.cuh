// A token's embedding row on the device, a token graph's first kernel: the decode step that
// runs one token ahead (CudaBackend::run_token) takes its token from the previous step's
// pick, which reaches the host only after that step, so the row cannot come from the host.
// The host's bits: dequant32 / plain_at follow src/quant/dequant.cpp operation for operation
// (cpu::embedding_row), and the scale is cpu::embed_tokens' one multiply.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

struct EmbedParams {
  int type = 0;              // any matmul_supported type, x8 layouts included
  const void* w = nullptr;   // [n_vocab] rows of row_bytes
  size_t row_bytes = 0;
  int64_t n = 0;             // elements a row
  float scale = 0.0f;        // > 0: each element times it (Hparams::embd_scale)
  const int32_t* id = nullptr;  // device: the row to take (< 0: row 0)
  float* x = nullptr;        // device: [n] out
  cudaStream_t stream = nullptr;
};
void launch_embed_row(const EmbedParams& p);

}  // namespace frink::cuda
