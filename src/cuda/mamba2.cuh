// Mamba-2 steps on the device (granitehybrid's recurrent layers). The host body, which these
// follow step by step: mamba2_layer in src/cpu/recurrent_layer.cpp (ggml_ssm_scan's Mamba-2
// branch). The in and out projections, the causal conv1d (delta_net.cuh's launch_conv1d_silu)
// and the FFN tail are the shared kernels.
//
// As the delta net's, the scan reads the layer's state in device memory (the sequence's
// recurrent mirror) and writes the new one in place or into the mirror's other copy
// (state_out: a token graph's step), and no launch depends on a host value that changes from
// token to token, so a decode step fits a captured token graph.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

// The ONE predicate for the shapes the scan takes (a lane holds d_state / 32 of a row's state).
inline constexpr int64_t kMamba2MaxState = 256;
bool mamba2_supported(int64_t d_state);

// The selective scan over n_tok tokens, a warp per state row (head h, channel p of its
// head_dim): dt = softplus(dt_raw + dt_bias[h]), s = s * exp(dt * a[h]) + B x dt,
// y = (s . C + d[h] x) * silu(z), B and C those of h's group (h / (n_head / n_group)).
struct Mamba2ScanParams {
  const float* xbc = nullptr;  // [n_tok][xbc_stride]: x (d_inner) | B (n_group x d_state) | C (same), post-conv
  int64_t xbc_stride = 0;
  const float* zdt = nullptr;  // [n_tok][zdt_stride]: z at [0, d_inner), dt_raw at dt_off + h
  int64_t zdt_stride = 0, dt_off = 0;
  const float* dt_bias = nullptr;  // [n_head]
  const float* a = nullptr;        // [n_head]: -exp(A_log)
  const float* d = nullptr;        // [n_head]: the skip D
  float* state = nullptr;          // [n_head][head_dim][d_state]; updated
  float* state_out = nullptr;      // or, when set, the new state goes here (state only read)
  float* y = nullptr;              // out [n_tok][n_head * head_dim]
  int64_t n_tok = 0, n_head = 0, head_dim = 0, d_state = 0, n_group = 0;
  cudaStream_t stream = nullptr;
};
void launch_mamba2_scan(const Mamba2ScanParams& p);

// y = rms(y) * w over each of the n_group groups of a row's width / n_group (the gated
// norm's norm: the gate ran in the scan), w's group g at g * width / n_group.
struct GroupNormParams {
  float* y = nullptr;        // [n_tok][width], in place
  const float* w = nullptr;  // [width]
  int64_t n_tok = 0, width = 0, n_group = 1;
  float eps = 0.0f;
  cudaStream_t stream = nullptr;
};
void launch_group_rms_norm(const GroupNormParams& p);

}  // namespace frink::cuda
