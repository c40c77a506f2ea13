// The host mixture-of-experts feed-forward block: the reference for every MoE model, written
// to follow llama.cpp's build_moe_ffn step by step (src/llama-graph.cpp) so the two agree to
// rounding:
//
//   logits = ffn_gate_inp x (+ bias)                          [n_expert]
//   probs  = softmax(logits) | sigmoid(logits) | logits        (plan.gating)
//   chosen = top-k of probs + exp_probs_b                      (the bias ranks, never weighs)
//            (with n_group > 1: only among the best n_group_used expert groups)
//   w      = probs[chosen]; softmax over them (kSoftmaxWeight); / max(sum w, 6.1e-5) (norm_w);
//            * w_scale
//   y      = sum over k of w_k * (down_e(glu(gate_e x, up_e x)))  in the order chosen
//   y     += shared expert (* sigmoid(ffn_gate_inp_shexp x) when gated)
//
// DeepSeek-V3 / Qwen3-Next style routing (sigmoid gating, selection bias, normalised and
// scaled weights, a shared expert) is a configuration of MoePlan, not another code path.
//
// A token's activation is dotted only with its chosen experts' rows. For a batch, tokens are
// grouped by expert first, so each expert matrix is read once per batch however many of the
// batch's tokens chose it.
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace frink::cpu {

// h [n_tok][n_embd] (the normed FFN input) -> out [n_tok][n_embd]. Requires p.ffn == kMoe.
void moe_ffn(const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok, int64_t n_embd,
             float* out, ThreadPool& pool);

// The routing step alone, for one token: logits [n_expert] -> the chosen experts (best
// first, ties to the lower index) and their weights, both [n_expert_used]. `bias` is
// exp_probs_b or null. logits is overwritten with the probabilities.
void route_token(const MoePlan& plan, float* logits, const float* bias, int32_t* chosen, float* weights);

}  // namespace frink::cpu
