// Gated DeltaNet steps on the device (qwen3next / qwen35 linear-attention layers). Host
// bodies, which these follow step by step: delta_net_layer in src/cpu/recurrent_layer.cpp
// (gates, causal conv1d with its state, the l2 norm of q and k) and delta_rule_recurrent in
// src/cpu/delta_rule.cpp (the recurrence). The projections, the gated RMSNorm (the GLU with
// z as the gate and its up norm, GluParams::up_norm_w, run by ssm_out's producer:
// MatmulParams::pre_glu) and the FFN tail are the shared kernels.
//
// Every step reads the layer's state in device memory (the sequence's recurrent mirror) and
// writes the new one in place, or into the mirror's other copy (state_out: a token graph's
// step, which a step run ahead must be able to drop), and no launch depends on a host value
// that changes from token to token, so the steps fit a captured token graph that is replayed
// every decode step.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

inline constexpr int64_t kDeltaMaxHeadDim = 256;  // the recurrence's 16 rows per thread x 16 warps
inline constexpr int64_t kConvMaxWidth = 64;      // as the model reader allows
// The chunked delta rule's threshold: one full chunk. Below it the chunked form would pay its
// per-chunk products for fewer tokens than the recurrence walks. Measured at this threshold
// (H200, qwen3-next 4 layers Q4_0): pp512 / pp2048 +1-3% over the recurrence (docs/gpu-notes.md).
inline constexpr int64_t kDeltaChunkMinTokens = 64;

// The ONE predicate for the shapes these kernels take (a layer outside it refuses, kShape).
bool delta_net_supported(int64_t head_dim, int64_t conv_width);

// beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a, per token and value head.
struct DeltaGatesParams {
  const float* ba = nullptr;   // [n_tok][2 * n_v_head] raw projections, laid out as `fused` says
  // true (ssm_ba, qwen3next): per key head [beta (rf) | alpha (rf)], value head = key head *
  // rf + r, rf = n_v_head / n_k_head. false (ssm_beta, ssm_alpha): [beta (n_v) | alpha (n_v)].
  bool fused = false;
  int64_t n_tok = 0, n_v_head = 0, n_k_head = 0;
  const float* dt_bias = nullptr;  // [n_v_head]
  const float* a = nullptr;        // [n_v_head]: -exp(A_log)
  float* beta = nullptr;           // out [n_tok][n_v_head]
  float* g = nullptr;              // out [n_tok][n_v_head]: the log decay
  cudaStream_t stream = nullptr;
};
void launch_delta_gates(const DeltaGatesParams& p);

// The causal depthwise convolution (ggml_ssm_conv) of n_tok new rows after the state's
// width - 1: y[t][c] = silu(sum_j w[c][j] * in[t + j - (width - 1)] (+ bias[c])), where in
// reads the state's rows before row 0 of x; then the state becomes the last width - 1 inputs.
// Two launches: the outputs (every (t, c) in parallel, the state only read), then the state
// shift (one thread per channel).
struct ConvParams {
  const float* x = nullptr;   // [n_tok][x_stride] raw inputs, channels [0, channels)
  int64_t x_stride = 0;
  float* y = nullptr;         // out [n_tok][y_stride]; must not overlap x or state
  int64_t y_stride = 0;
  int64_t n_tok = 0, channels = 0, width = 0;
  const float* w = nullptr;     // [channels][width], oldest input's tap first
  const float* bias = nullptr;  // [channels] or null
  float* state = nullptr;       // [width - 1][channels], oldest first; updated
  float* state_out = nullptr;   // or, when set, the new state goes here (state only read)
  cudaStream_t stream = nullptr;
};
void launch_conv1d_silu(const ConvParams& p);

// x / max(||x||, eps) (ggml_l2_norm) on n_head rows of n floats per token: row (t, h) at
// x + t * x_stride + h * n. One warp per row; the sum of squares in f32 (the host's in double:
// a relative difference near 1e-7).
struct L2NormParams {
  float* x = nullptr;
  int64_t x_stride = 0, n_tok = 0, n_head = 0, n = 0;
  float eps = 0.0f;
  cudaStream_t stream = nullptr;
};
void launch_l2_norm(const L2NormParams& p);

// A decode token (n_tok 1 in all three): launch_delta_gates(g), launch_conv1d_silu(c) and
// launch_l2_norm(l) on its output (l.x == c.y) as ONE launch, the same bits. Block b takes the
// l.n channels of head b (channels a multiple of l.n: the q, k and v heads of d_state). Why: on
// a decode token's chain these were four launches of 2.3-3.2 us each (qwen3-next, ncu, H200).
bool delta_decode_prep_ok(const ConvParams& c, const L2NormParams& l, const DeltaGatesParams& g);
void launch_delta_decode_prep(const ConvParams& c, const L2NormParams& l, const DeltaGatesParams& g);

// The gated delta rule over tokens [0, n_tok), each value head against its state [d][d]
// (S[i][j], i over keys): cpu::delta_rule_recurrent, i.e.
//   S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T (q_t q_scale).
// Two kernels compute it; delta_rule_uses_chunks picks one per launch.
// - Recurrent (decode, short batches): token after token. Column j of S evolves on its own, so
//   a block holds 32 columns of one head in registers (16 rows per thread, ceil(d / 16) warps)
//   for the WHOLE run; a long prompt costs n_tok dependent steps per block.
// - Chunked (prefill, n_tok >= chunk_min_tokens): the WY/UT form of cpu::delta_rule_chunked
//   over chunks of 64 tokens, the same blocks (head, 32 columns) walking the chunks in order
//   with their S tile in shared memory; per chunk the work is small matrix products.
// The two agree to f32 rounding (tests/gpu/delta_net_test.cpp).
struct DeltaRuleParams {
  // [n_tok][qkv_stride], the conv output after the l2 norm: q of key head h at h * d, k at
  // (n_k_head + h) * d, v of value head hv at 2 * n_k_head * d + hv * d.
  const float* qkv = nullptr;
  int64_t qkv_stride = 0;
  const float* beta = nullptr;  // [n_tok][n_v_head]
  const float* g = nullptr;     // [n_tok][n_v_head]
  float* out = nullptr;         // [n_tok][out_stride]: value head hv at hv * d
  int64_t out_stride = 0;
  float* state = nullptr;       // [n_v_head][d][d], updated
  float* state_out = nullptr;   // or, when set, the new state goes here (state only read)
  int64_t n_tok = 0, n_v_head = 0, n_k_head = 0, d = 0;
  // Which key head value head hv reads: hv % n_k_head when tiled, else hv / (n_v_head / n_k_head)
  // (SsmPlan::kv_head_tiled).
  bool kv_head_tiled = false;
  float q_scale = 1.0f;
  // Batches of at least this many tokens take the chunked kernel (where the device's shared
  // memory holds its tile); tests set it past n_tok to force the recurrence.
  int64_t chunk_min_tokens = kDeltaChunkMinTokens;
  cudaStream_t stream = nullptr;
};
// The ONE dispatch predicate: true when launch_delta_rule(p) runs the chunked kernel (n_tok >=
// p.chunk_min_tokens and its shared memory, 130 KB at d 128, 216 KB at d 256, fits the current
// device's opt-in limit). Queries the current device only when n_tok passes the threshold.
bool delta_rule_uses_chunks(const DeltaRuleParams& p);
void launch_delta_rule(const DeltaRuleParams& p);

}  // namespace frink::cuda
