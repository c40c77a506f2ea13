// The gated delta rule (Gated DeltaNet, Yang et al. 2024) for one value head over a run of
// tokens, in two formulations that compute the same function:
//
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T
//   o_t = S_t^T (q_t * q_scale)
//
// with S [d_k][d_v] the head's state (row i = key dimension i), g_t the log decay and beta_t
// the write strength. This is ggml's gated_delta_net op / llama.cpp's
// build_delta_net_autoregressive, and transformers' torch_recurrent_gated_delta_rule.
//
// delta_rule_recurrent walks the tokens one by one: two passes over S per token. It is the
// decode path and the reference.
//
// delta_rule_chunked is the prefill path (llama.cpp's build_delta_net_chunking, fla's
// chunk_gated_delta_rule; the WY/UT representation): within a chunk of L tokens with
// cumulative decay G_r = g_0 + ... + g_r,
//   A[r][s] = beta_r (k_r . k_s) exp(G_r - G_s)                 s < r
//   (I + A) U = beta V,   (I + A) W = beta exp(G) K              forward substitution
//   V' = U - W S                                                the chunk's corrected values
//   O  = exp(G) (Q S) + tril(Q K^T * exp(G_r - G_s)) V'
//   S <- exp(G_last) S + (K * exp(G_last - G))^T V'
// so the state is read three times per chunk instead of twice per token, and the work is
// matrix-matrix products. The two agree to f32 rounding (tests/engine/delta_rule_test.cpp).
#pragma once

#include <cstdint>

namespace frink::cpu {

// One value head's inputs for tokens [0, n): row t of q/k starts at q + t * qk_stride (d
// floats), of v at v + t * v_stride, of the output at out + t * out_stride; g_t and beta_t at
// g[t * gb_stride], beta[t * gb_stride].
struct DeltaRuleSeq {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qk_stride = 0, v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t gb_stride = 1;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t n = 0;   // tokens
  int64_t d = 0;   // head width (d_k == d_v)
  float q_scale = 1.0f;
};

// state [d][d] (S[i][j], i over keys) is read and left holding S_n.
void delta_rule_recurrent(const DeltaRuleSeq& s, float* state);
// The same with chunks of `chunk` tokens (the last may be shorter); chunk >= 1.
void delta_rule_chunked(const DeltaRuleSeq& s, float* state, int64_t chunk);

}  // namespace frink::cpu
