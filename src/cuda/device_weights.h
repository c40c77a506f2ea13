// Device residency: a model's weights uploaded ONCE, each matrix in its GGUF block format
// (dequantized inside the kernels, never widened on the device), 1-D vectors as f32. Q4_0,
// Q8_0, Q4_K and Q6_K matrices of suitable widths keep the same blocks and bytes, reordered
// within each group of 8 (matmul.cuh, x8_type), so decode lanes load them coalesced.
// Layers the device refuses, or that device memory cannot hold (place_layers), are not
// uploaded. Upload progress and the device memory used are logged (info level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "engine/device_backend.h"
#include "model/model.h"

namespace frink::cuda {

struct DeviceLinear {
  int type = 0;                 // ggml type id
  const void* w = nullptr;      // [n_out] rows of row_bytes
  size_t row_bytes = 0;
  int64_t n_in = 0, n_out = 0;
  const float* b = nullptr;     // [n_out] or null
  float scale = 1.0f;
  bool bias_before_scale = false;
  explicit operator bool() const { return w != nullptr; }
};

// A stack of experts (model Experts): expert e's matrix is expert_bytes from the next.
struct DeviceExperts {
  int type = 0;
  const void* w = nullptr;
  size_t row_bytes = 0, expert_bytes = 0;
  int64_t n_in = 0, n_out = 0;    // per expert
  const float* b = nullptr;       // [n_expert][n_out] or null
  const float* scale = nullptr;   // [n_expert] (+ 1 with a stacked shared expert) or null
  explicit operator bool() const { return w != nullptr; }
};

// An expert stack seen as its first expert's matrix: expert mode (slots, groups or heads) moves
// the products to the others.
inline DeviceLinear first_expert(const DeviceExperts& x) {
  DeviceLinear one;
  one.type = x.type;
  one.w = x.w;
  one.row_bytes = x.row_bytes;
  one.n_in = x.n_in;
  one.n_out = x.n_out;
  one.b = x.b;
  return one;
}

struct DeviceNorm {
  const float* w = nullptr;     // [n] or null
  const float* b = nullptr;     // [n] or null
};

struct DeviceLayer {
  DeviceNorm attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm;
  DeviceLinear wq, wk, wv, wqkv, wo, ffn_gate, ffn_up, ffn_down;
  // Multi-head latent attention (plan.attn == kMla; CudaBackend::enqueue_mla): wq (no q LoRA)
  // or wq_a -> q_a_norm -> wq_b, wkv_a_mqa -> kv_a_norm, and the per-head stacks wk_b / wv_b.
  DeviceLinear wq_a, wq_b, wkv_a_mqa;
  DeviceNorm q_a_norm, kv_a_norm;
  DeviceExperts wk_b, wv_b;
  const float* alibi_slopes = nullptr;  // [n_head] (plan.alibi), or null
  const float* attn_sinks = nullptr;    // [n_head] (plan.attn_sinks), or null
  // Mixture of experts (plan.ffn == kMoe)
  DeviceLinear router;                  // n_embd -> n_expert
  const float* exp_probs_b = nullptr;   // [n_expert] selection bias, or null
  DeviceExperts gate_exps, up_exps, gate_up_exps, down_exps;
  DeviceLinear gate_shexp, up_shexp, down_shexp;
  DeviceLinear gate_inp_shexp;          // the shared expert's gate logit: n_embd -> 1 (f32)
  // The shared expert stacked as experts n_expert.. of gate_exps / up_exps / down_exps, this
  // many (its own linears then null; 0: not stacked), run as slots k.. of every token; when
  // gated, its gate logit is the router's row n_expert (shared_expert_slots).
  int64_t shexp_slots = 0;
  // Recurrent layers: gated delta net (plan.recurrent == kGatedDeltaNet) and Mamba-2 (ssm_in,
  // conv, dt_b, a, d, norm, out); C = conv_channels, model/weights.h
  DeviceLinear ssm_in;                  // Mamba-2: n_embd -> z | xBC | dt (d_inner + C + n_v_head)
  DeviceLinear ssm_qkv;                 // n_embd -> q | k | v (C)
  DeviceLinear ssm_z;                   // n_embd -> z (d_inner)
  DeviceLinear ssm_ba;                  // n_embd -> per key head [beta | alpha], or null:
  DeviceLinear ssm_beta, ssm_alpha;     // n_embd -> n_v_head each
  DeviceLinear ssm_out;                 // d_inner -> n_embd
  const float* ssm_conv1d = nullptr;    // [C][d_conv]: channel c's taps, oldest input first
  const float* ssm_conv1d_b = nullptr;  // [C] or null
  const float* ssm_dt_b = nullptr;      // [n_v_head]
  const float* ssm_a = nullptr;         // [n_v_head]: -exp(A_log)
  const float* ssm_d = nullptr;         // Mamba-2: [n_v_head], the skip D
  const float* ssm_norm = nullptr;      // [head_v_dim] (delta net), [d_inner] (Mamba-2: n_group groups), or null
};

// Why layer il (or, for il == n_layer, the output head) cannot run on the device; pure.
// The ONE predicate: check_layer answers from it and residency uploads by it.
Refusal device_refusal(const Model& m, int64_t il);

// Which layers' weights go to the device (a model larger than its memory runs its first layers
// on the host, as llama.cpp's -ngl does): what device_refusal leaves, less kMemory for what
// does not fit in budget_bytes beside every attention layer's K/V mirror for n_ctx positions
// (the ones left on the host are lent to prompt batches, with two slots of the largest layer).
// The head first, then the last layers down; the first that does not fit leaves every earlier
// one on the host (one crossing of the residual a pass). n_gpu_layers >= 0: at most that many
// layers, the head only past n_layer. Pure: bytes are DeviceWeights::upload_bytes (n_layer + 1).
struct Placement {
  int64_t n_gpu_layers = -1;
  size_t budget_bytes = SIZE_MAX;
  int64_t n_ctx = 4096;
};
std::vector<Refusal> place_layers(const Model& m, std::span<const size_t> bytes, const Placement& o);

// parts (whole rows of row_bytes each) joined, each row padded with zeros to dev_row_bytes
// (device_row_bytes): the rows DeviceWeights uploads, which the tests build the same way.
std::vector<char> padded_rows(const std::vector<std::pair<const void*, size_t>>& parts, size_t row_bytes,
                              size_t dev_row_bytes);

class DeviceWeights {
 public:
  // Uploads each layer, and the head, placed kNone (placed: n_layer + 1 entries, as
  // place_layers gives); stack_shared: shared experts stacked with the routed ones where they
  // fit (DeviceLayer::shexp_slots).
  DeviceWeights(const Model& m, std::span<const Refusal> placed, bool stack_shared = true);
  // What each layer's upload takes, and the head's (il == n_layer, with the token embedding a
  // token graph reads), counted by the same code with nothing allocated (counted): no device
  // needed. Refused layers 0.
  static std::vector<size_t> upload_bytes(const Model& m, bool stack_shared = true);
  // Enqueues the copy of n bytes from the host's src to the device's dst on the fill's stream.
  using FillCopy = std::function<void(void* dst, const void* src, size_t n)>;
  // A layer placed kMemory, lent the device for one batch (CudaBackend's lent prompt layers):
  // its weights copied into `slot` (at least fill_bytes(il)) by `copy` (or cudaMemcpyAsync on
  // `stream`, the driver staging a pageable source) and reordered on `stream`, layer(il)
  // pointing there until the slot's next fill.
  void fill(const Model& m, int64_t il, void* slot, size_t slot_bytes, cudaStream_t stream, const FillCopy& copy = {});
  // What fill(il) takes of a slot (counted).
  size_t fill_bytes(const Model& m, int64_t il) const;
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const DeviceLayer& layer(int64_t il) const { return layers_[static_cast<size_t>(il)]; }
  DeviceNorm output_norm;
  DeviceLinear output;
  // The token embedding, whose row a token graph's first kernel takes (a decode step run one
  // ahead knows its token only here: CudaBackend::run_token): uploaded where every layer and
  // the head run here and no norm follows the embedding; else null.
  // A tied head's upload serves both.
  DeviceLinear token_embd;
  const float* rope_freqs = nullptr;
  size_t bytes() const { return bytes_; }
  int64_t shared_stacked() const { return shared_stacked_; }  // layers with shexp_slots

 private:
  DeviceWeights() = default;  // counted's: a fill without a slot
  // What uploading layer il (il == n_layer: the head, with the token embedding) places in a
  // slot, each piece at fill's alignment: the upload code run with nothing allocated or copied.
  static size_t counted(const Model& m, int64_t il, bool stack_shared);
  void upload_layer(const Model& m, int64_t il, bool stack_shared);
  // all_layers: every layer is on the device too, so a token graph takes its token's row there.
  void upload_head(const Model& m, bool all_layers);
  const void* upload(const void* host, size_t n_bytes);
  // Whether uploads copy bytes (not a fill that only counts them).
  bool copies() const { return !fill_ || fill_->base; }
  // parts (whole rows of row_bytes) with each row padded to dev_row_bytes (device_row_bytes).
  const void* upload_rows(const std::vector<std::pair<const void*, size_t>>& parts, size_t row_bytes,
                          size_t dev_row_bytes, bool temporary = false);
  const float* upload_vec(const float* host, int64_t n);
  const float* upload_values(const std::vector<float>& v);  // computed here, never shared
  DeviceLinear linear(const Linear& l);
  DeviceExperts experts(const Experts& x, int64_t n_expert);
  // A stack of n_expert + n_more experts: x's, then n_more made of a (x's type), scaled by a's
  // scale: a's rows in n_more shares, each followed by b's same share (b may be null); or
  // by_columns, a's rows cut into n_more column ranges (x's n_in each), one expert each.
  DeviceExperts experts_and(const Experts& x, int64_t n_expert, int64_t n_more, const Linear* a, const Linear* b,
                            bool by_columns);
  // temporary: some part is the caller's, gone when this returns.
  const void* upload_joined(const std::vector<std::pair<const void*, size_t>>& parts, bool temporary = false);
  DeviceNorm norm(const Norm& n, int64_t len);
  // The type id matrix d (n_bytes, rows of n_in) is kept as, reordered for it if need be.
  int device_layout(const void* d, size_t n_bytes, int type, int64_t n_in);

  std::vector<DeviceLayer> layers_;
  std::vector<void*> allocations_;
  std::map<const void*, const void*> uploaded_;  // host data -> device copy (tied weights once)
  std::set<const void*> repacked_;               // device copies reordered (device_layout)
  size_t bytes_ = 0;
  int64_t shared_stacked_ = 0;
  // fill: pieces placed in a slot at aligned offsets, copied on its stream; without a slot
  // (base null) only placed, to count a layer's bytes or to take its shape.
  struct Fill {
    char* base = nullptr;
    size_t cap = SIZE_MAX, off = 0;
    cudaStream_t stream = nullptr;
    std::map<const void*, const void*> seen;  // tied pieces once
    const FillCopy* copy = nullptr;
  };
  void fill_copy(void* dst, const void* src, size_t n);
  Fill* fill_ = nullptr;
  static constexpr size_t kFillAlign = 256;
  bool stack_shared_ = true;
  // The slot address of the next piece of n bytes (fill_).
  char* fill_place(size_t n);
};

}  // namespace frink::cuda
