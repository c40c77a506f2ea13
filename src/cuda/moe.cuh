// Mixture-of-experts steps on the device (host reference: src/cpu/moe.cpp, which follows
// llama.cpp's build_moe_ffn): routing each token to its experts, and combining the chosen
// experts' outputs. The expert products themselves are launch_matmul in expert mode
// (MatmulParams::slot_expert), reading the routing from device memory, so a MoE layer needs
// no round trip to the host and fits in a captured token graph.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

inline constexpr int64_t kMoeMaxExperts = 512;  // experts a routing warp holds (16 per lane)

struct RouteParams {
  const float* logits = nullptr;    // [n_tok][n_expert]: the router's output (its bias included)
  const float* sel_bias = nullptr;  // [n_expert] exp_probs_b, or null: ranks, never weighs
  int64_t n_tok = 0, n_expert = 0, k = 0;
  int gating = 0;                   // ExpertGating: 0 softmax, 1 sigmoid, 2 softmax of the k chosen
  bool norm_w = false;              // weights / max(sum, 6.1e-5)
  float w_scale = 1.0f;             // then * w_scale (0 or 1: none)
  int32_t* expert = nullptr;        // out [n_tok][k]: chosen experts, best first, ties to the lower id
  float* weight = nullptr;          // out [n_tok][k]
  cudaStream_t stream = nullptr;
};
// One warp per token, the host's route_token step for step (group-limited routing is not
// here: such layers refuse upstream).
void launch_route(const RouteParams& p);

struct CombineParams {
  const float* y = nullptr;         // [n_tok * k][n_embd]: expert outputs, slot t * k + j
  const float* weight = nullptr;    // [n_tok * k]
  int64_t n_tok = 0, k = 0, n_embd = 0;
  const float* shared = nullptr;    // [n_tok][n_embd] shared expert output, or null
  const float* shared_gate = nullptr;  // [n_tok] its gate logits (qwen2moe), or null: weight 1
  const float* residual = nullptr;  // [n_tok][n_embd], or null; may alias out
  float* out = nullptr;             // [n_tok][n_embd]
  cudaStream_t stream = nullptr;
};
// out = (residual +) (sum_j weight_j y_j in the order chosen, + shared * sigmoid(gate)), in
// the host's order of operations (the compiler may still fuse a multiply-add: not bit for bit).
void launch_moe_combine(const CombineParams& p);

}  // namespace frink::cuda
