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
// A stack's experts at most: the routed ones and the stacked shared expert's slots
// (RouteParams::n_shared; the routing's 32 slots hold them and at least one routed).
inline constexpr int64_t kMoeMaxStack = kMoeMaxExperts + 31;

struct RouteParams {
  const float* logits = nullptr;    // [n_tok][n_expert (+ 1: shared_gated)]: the router's output (its bias included)
  const float* sel_bias = nullptr;  // [n_expert] exp_probs_b, or null: ranks, never weighs
  int64_t n_tok = 0, n_expert = 0, k = 0;
  int gating = 0;                   // ExpertGating: 0 softmax, 1 sigmoid, 2 softmax of the k chosen
  bool norm_w = false;              // weights / max(sum, 6.1e-5)
  float w_scale = 1.0f;             // then * w_scale (0 or 1: none)
  // A shared expert stacked as experts n_expert .. n_expert + n_shared - 1 (DeviceLayer::
  // shexp_slots: one as wide as n_shared routed ones, split by rows) takes slots k .. k +
  // n_shared - 1 of every token, each weighted 1, or, shared_gated, sigmoid(logit n_expert)
  // (the router's extra row): the slots' down products add up to the whole expert's.
  int n_shared = 0;
  bool shared_gated = false;
  // Group-limited routing (DeepSeek-V3's n_group / topk_group; MoePlan): only the experts of
  // the best n_group_used of n_group groups may be chosen. n_group 0 or 1: off.
  int n_group = 0, n_group_used = 0;
  int32_t* expert = nullptr;        // out [n_tok][k + n_shared]: chosen experts, best first, ties to the lower id
  float* weight = nullptr;          // out [n_tok][k + n_shared]
  cudaStream_t stream = nullptr;
};
// One warp per token, the host's route_token step for step (group-limited routing included).
void launch_route(const RouteParams& p);
// Whether route_token can run p (launch_route's and MatmulParams::route's check): 1 to
// kMoeMaxExperts experts, 1 to n_expert chosen, slots (k + n_shared) within
// route_token's arrays, a known gating and shared mode, at most 32 groups (a lane each)
// dividing the experts.
bool route_params_ok(const RouteParams& p);

// An F32 router's product of one token's normed h, run beside the norm that makes h
// (launch_matmul_producer with a router: launch_norm_router in act_prep.cu): each row's block
// norms the residual itself, so the router does not wait on the norm. Measured (H200,
// qwen3-30b-a3b Q4_0 tg128 graph, one call, alternating): 2.436 / 2.442 / 2.443 -> 2.374 /
// 2.374 / 2.383 ms. (The norm on a forked branch of the graph beside a router that normed x
// itself lost: an empty fork joined back on the layer's chain alone cost 0.15 ms a token,
// 3 us a layer.)
struct RouterNormParams {
  const float* w = nullptr;  // [n_expert][n_embd] F32 router rows, 16-byte aligned
  const float* b = nullptr;  // [n_expert] added to each logit after the dot (gpt-oss), or null
  int64_t n_embd = 0, n_expert = 0;
  float* logits = nullptr;   // out [n_expert]
};

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
// (A decode token's experts without a shared expert of their own take this sum in their down
// product's launch instead where its rows allow: MatmulParams::combine_w, the same bits.)
void launch_moe_combine(const CombineParams& p);

// Prompt-sized batches take their expert products as one matrix product per expert (the rows
// of the tokens routed to it), not one matrix-vector product per slot, which read each
// expert's weights once per slot: qwen3-30b-a3b pp512 1710 t/s (H200). The rows are put in
// expert order, each expert's tokens' rows together (MatmulParams::group_rows). (Blocks of the
// largest count per expert, for calls of one shape, were ruinous where the routing is skewed:
// a synthetic model's busiest expert takes most tokens, and every block grew to its height.)
inline constexpr int64_t kMoeSortMaxSlots = 8192;  // slot ids the sort holds in shared memory
// Batches whose slots give the experts at least this many rows each, on average, take them:
// each expert costs a call of fixed overhead, the slots' matrix-vector products a weight read
// per row. H200, slots against grouped (t/s): qwen3-30b-a3b Q4_0 (128 experts of 768 x 2048)
// pp64 (4 rows an expert) 1490 / 936-977, pp128 (8) 1613 / 1498-1778, pp256 (16) 1674 / 2861,
// pp512 (32) 1697 / 3740-4774; qwen3-next-80b-a3b Q4_0, 8 layers (512 experts of 512 x 2048)
// pp512 (10) 6273-7291 / 2796-3456.
inline constexpr int64_t kMoeGroupMinRows = 16;
struct SlotSort {
  const int32_t* expert = nullptr;  // [n_slots]: launch_route's output
  int64_t n_slots = 0, n_expert = 0;  // n_expert: the stack's, up to kMoeMaxStack
  int32_t* count = nullptr;         // out [n_expert]: slots per expert
  int32_t* pos = nullptr;           // out [n_slots]: the slot's row in expert order (then slot order)
  cudaStream_t stream = nullptr;
};
// One block: counts and each expert's first row, then one warp places the slots in slot order
// (deterministic).
void launch_sort_slots(const SlotSort& p);
// to_rows: row pos[s] of dst = row s / x_div of src, for every slot s; else row s of dst = row
// pos[s] of src. Rows of `width` floats.
void launch_slot_rows(float* dst, const float* src, int64_t width, const int32_t* pos, int64_t n_slots, int64_t x_div,
                      bool to_rows, cudaStream_t stream);
// The experts' biases of rows in expert order (the grouped products add none): row pos[s] of y
// (rows y_stride apart) += bias row expert[s] (rows `width` apart), for every slot s.
void launch_slot_bias(float* y, int64_t y_stride, int64_t width, const float* bias, const int32_t* expert,
                      const int32_t* pos, int64_t n_slots, cudaStream_t stream);

}  // namespace frink::cuda
