// Element-wise device ops of a layer: gated activations (SwiGLU/GeGLU), plain activations,
// residual adds, softcap. Host bodies: cpu::silu_inplace, cpu::gelu_tanh_inplace,
// cpu::softcap_inplace and the adds in cpu::attention_layer.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

// 256-thread blocks over [rows][width] elements: x along a row, y over the rows (both capped;
// the kernels loop). Why not a flat index: its division and remainder by the width are 64-bit
// (an 8B pp512 GLU over 512 x 14336 took 49.6 us for 88 MB that way, H200 ncu).
inline dim3 row_grid(int64_t width, int64_t rows) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((width + 255) / 256, 1 << 16)),
              static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

struct GluParams {
  const float* gate = nullptr;  // [n_tok][gate_stride]
  const float* up = nullptr;    // [n_tok][up_stride], or null: out = act(gate) alone
  int64_t gate_stride = 0, up_stride = 0;
  float* out = nullptr;         // [n_tok][n]
  int64_t n = 0, n_tok = 0;
  bool gelu = false;            // false: SiLU
  bool oai = false;             // gpt-oss's clamped SwiGLU (ggml_swiglu_oai) instead; needs up
  // up RMS-normed in groups of up_norm_n elements (times up_norm_w[j % up_norm_n]) before the
  // product with act(gate): the gated delta net's output norm, in the launch that computes the
  // GLU (glu_norm_ok). Null: up as it is.
  const float* up_norm_w = nullptr;
  int64_t up_norm_n = 0;
  float up_norm_eps = 0.0f;
  cudaStream_t stream = nullptr;
};
// With an up norm, p must pass glu_norm_ok (else cudaErrorInvalidValue).
void launch_glu(const GluParams& p);
// Whether p's up norm can run in its GLU's launches (here and act_prep.cu's): a block of 256
// threads holds 256 elements of one token, so groups must tile it and rows be whole blocks.
inline bool glu_norm_ok(const GluParams& p) {
  return p.up && !p.oai && p.up_norm_n > 0 && p.up_norm_n % 32 == 0 && 256 % p.up_norm_n == 0 && p.n % 256 == 0;
}

// y[i] = a[i] + b[i] (+ c[i] when c is set), i < n. y may alias a.
void launch_add(float* y, const float* a, const float* b, const float* c, int64_t n, cudaStream_t stream);
// x[i] *= sigmoid(gate[i]), as 1 / (1 + exp(-gate)) (the host's gated attention).
void launch_sigmoid_mul(float* x, const float* gate, int64_t n, cudaStream_t stream);
// x[i] = cap * tanh(x[i] / cap).
void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// *out = the index of the largest of x[0, n), the lowest on ties (engine greedy_token's rule),
// in two passes: kArgmaxBlocks blocks each reduce a strided share into scratch, one block
// reduces those (launched as a dependent: pdl.cuh). scratch: argmax_scratch_bytes() on the
// device. advance (or null): *advance += 1 with the pick, for the step the pick is the
// token of (a token graph's position: CudaBackend's step ahead then needs no copy of it).
inline constexpr int kArgmaxBlocks = 128;
size_t argmax_scratch_bytes();
void launch_argmax(const float* x, int64_t n, void* scratch, int32_t* out, cudaStream_t stream,
                   int32_t* advance = nullptr);

}  // namespace frink::cuda
