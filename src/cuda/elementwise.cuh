// Element-wise device ops of a layer: gated activations (SwiGLU/GeGLU), plain activations,
// residual adds, softcap. Host bodies: cpu::silu_inplace, cpu::gelu_tanh_inplace,
// cpu::softcap_inplace and the adds in cpu::attention_layer.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

struct GluParams {
  const float* gate = nullptr;  // [n_tok][gate_stride]
  const float* up = nullptr;    // [n_tok][up_stride], or null: out = act(gate) alone
  int64_t gate_stride = 0, up_stride = 0;
  float* out = nullptr;         // [n_tok][n]
  int64_t n = 0, n_tok = 0;
  bool gelu = false;            // false: SiLU
  bool oai = false;             // gpt-oss's clamped SwiGLU (ggml_swiglu_oai) instead; needs up
  cudaStream_t stream = nullptr;
};
void launch_glu(const GluParams& p);

// y[i] = a[i] + b[i] (+ c[i] when c is set), i < n. y may alias a.
void launch_add(float* y, const float* a, const float* b, const float* c, int64_t n, cudaStream_t stream);
// x[i] *= sigmoid(gate[i]), as 1 / (1 + exp(-gate)) (the host's gated attention).
void launch_sigmoid_mul(float* x, const float* gate, int64_t n, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap).
void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// *out = the index of the largest of x[0, n), the lowest on ties (engine greedy_token's rule),
// in two passes: kArgmaxBlocks blocks each reduce a strided share into scratch, one block
// reduces those. scratch: argmax_scratch_bytes() on the device.
inline constexpr int kArgmaxBlocks = 128;
size_t argmax_scratch_bytes();
void launch_argmax(const float* x, int64_t n, void* scratch, int32_t* out, cudaStream_t stream);

}  // namespace frink::cuda
