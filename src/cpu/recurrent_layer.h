// The host bodies of the recurrent layers of hybrid models, the reference for any device
// version. Each follows llama.cpp's graph step by step (so the two agree to rounding):
//
// Gated DeltaNet (qwen3next / qwen35 / qwen35moe; llama.cpp build_layer_attn_linear):
//   h = rms(x) * attn_norm
//   qkv = attn_qkv h; z = attn_gate h; beta, alpha = ssm_ba h (or ssm_beta h, ssm_alpha h)
//   qkv = silu(causal_conv1d(qkv))                  width d_conv, state = last d_conv-1 inputs
//   q, k = l2norm(q), l2norm(k) per key head;       beta = sigmoid(beta)
//   g = softplus(alpha + dt_bias) * ssm_a           (ssm_a = -exp(A_log))
//   o = gated_delta_rule(q / sqrt(d), k, v, g, beta) per value head (src/cpu/delta_rule.h)
//   x += ssm_out(rms(o) * ssm_norm * silu(z))       per value head
// Mamba-2 (granitehybrid; llama.cpp build_mamba2_layer, ggml_ssm_scan):
//   z | xBC | dt = ssm_in h;  xBC = silu(conv1d(xBC) + conv_bias);  x | B | C = xBC
//   per head: dt' = softplus(dt + dt_bias); s = exp(dt' A) s + (dt' x) B^T; y = s C + D x
//   y = rms_grouped(y * silu(z)) * ssm_norm;  x += ssm_out y
// Both then run the layer's FFN on rms(x) * ffn_norm and add it.
//
// State (RecurrentState, per layer): conv [d_conv - 1][channels]; delta net
// [n_v_head][d][d] (S[i][j], i over keys), Mamba-2 [n_head][head_dim][d_state].
// Snapshots: the batch is cut at every position the state asks for (wants_snapshot), so a
// snapshot is exact whatever the batch boundaries were.
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "kv/recurrent_state.h"
#include "model/model.h"

namespace frink::cpu {

// The state sizes of a recurrent layer (zeros for an attention layer).
RecurrentState::LayerShape recurrent_state_shape(const LayerPlan& p);

// Runs recurrent layer il (plan.recurrent != kNone) on x [n_tok][n_embd], tokens at
// positions [pos0, pos0 + n_tok); x receives the layer's output and the layer's live state
// moves to pos0 + n_tok. delta_chunk: tokens per chunk of the delta rule in a multi-token
// batch (0: token by token, the recurrence decode uses).
void recurrent_layer(const Model& m, int64_t il, RecurrentState& state, float* x, int64_t n_tok, int64_t pos0,
                     int64_t delta_chunk, ThreadPool& pool);

}  // namespace frink::cpu
