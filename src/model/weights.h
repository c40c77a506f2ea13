// Weights: views into the mapped model file, one struct per layer, shapes in comments in
// ggml order ([ne0] = row length). Nothing is copied except 1-D vectors stored as F16/BF16
// (norm weights and biases of SafeTensors models), which are widened once to f32.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "format/model_file.h"
#include "model/hparams.h"

namespace frink {

// y = W x (+ b), W a matrix [n_in] -> [n_out] in any supported block type.
struct Linear {
  const TensorView* w = nullptr;   // ne = {n_in, n_out}
  const float* b = nullptr;        // [n_out] or null
  float scale = 1.0f;              // per-tensor output scale ("*.scale" tensors) or 1
  // llama.cpp applies the scale after the bias in FFN projections ((Wx + b) * s) but
  // before it in attention projections (Wx * s + b); this records which.
  bool bias_before_scale = false;
  explicit operator bool() const { return w != nullptr; }
  int64_t n_in() const { return w->ne[0]; }
  int64_t n_out() const { return w->ne[1]; }
};

// A stack of n_expert matrices [n_in] -> [n_out] in one 3-D tensor {n_in, n_out, n_expert}:
// expert e's matrix is rows [e * n_out, (e + 1) * n_out) of the 2-D view. llama.cpp applies
// an expert's output as (W_e x) * scale[e] + b[e] (build_lora_mm_id, then ggml_add_id).
struct Experts {
  const TensorView* w = nullptr;   // ne = {n_in, n_out, n_expert}
  const float* b = nullptr;        // [n_expert][n_out] or null
  const float* scale = nullptr;    // [n_expert] or null
  explicit operator bool() const { return w != nullptr; }
  int64_t n_in() const { return w->ne[0]; }
  int64_t n_out() const { return w->ne[1]; }
};

struct Norm {
  const float* w = nullptr;        // [n]
  const float* b = nullptr;        // [n], LayerNorm only
  explicit operator bool() const { return w != nullptr; }
};

struct LayerWeights {
  Norm attn_norm;                  // [n_embd]
  Linear wq, wk, wv;               // n_embd -> n_head*hd_k | n_head_kv*hd_k | n_head_kv*hd_v
  Linear wqkv;                     // fused alternative: n_embd -> q|k|v concatenated
  Norm q_norm, k_norm;             // [hd_k], per head (qk_norm)
  Linear wo;                       // n_head*hd_v -> n_embd
  Norm post_attn_norm;             // [n_embd] (sandwich)
  Norm ffn_norm;                   // [n_embd]
  Linear ffn_gate, ffn_up;         // n_embd -> n_ff (ffn_up is 2*n_ff wide when fused with gate)
  Linear ffn_down;                 // n_ff -> n_embd
  Norm post_ffn_norm;              // [n_embd]
  const float* attn_sinks = nullptr; // [n_head] (plan.attn_sinks)

  // Multi-head latent attention (plan.attn == kMla; src/cpu/mla_attention.h). attn_norm and
  // wo as above; wq serves the models without a q LoRA. H = n_head, dk = head_dim_k,
  // nope = dk - n_rot, R = kv_lora_rank.
  Linear wq_a;                     // n_embd -> q_lora_rank
  Norm q_a_norm;                   // [q_lora_rank]
  Linear wq_b;                     // q_lora_rank -> H * dk, per head [nope | rope]
  Linear wkv_a_mqa;                // n_embd -> R + n_rot: [compressed kv | k_pe]
  Norm kv_a_norm;                  // [R]
  Experts wk_b;                    // per head h: nope -> R ({nope, R, H}), absorbed into q
  Experts wv_b;                    // per head h: R -> head_dim_v ({R, head_dim_v, H})

  // Mixture of experts (plan.ffn == kMoe); ffn_norm is the block's input norm.
  Linear ffn_gate_inp;             // router: n_embd -> n_expert (+ bias, gpt-oss)
  const float* exp_probs_b = nullptr; // [n_expert] selection bias, or null
  Experts ffn_gate_exps, ffn_up_exps;  // n_embd -> n_ff_exp per expert
  Experts ffn_gate_up_exps;        // fused alternative: n_embd -> gate|up (2 * n_ff_exp)
  Experts ffn_down_exps;           // n_ff_exp -> n_embd per expert
  Linear ffn_gate_shexp, ffn_up_shexp; // shared expert: n_embd -> n_ff_shexp
  Linear ffn_down_shexp;           // n_ff_shexp -> n_embd
  const float* ffn_gate_inp_shexp = nullptr; // [n_embd]: the shared expert's gate logit row

  // Recurrent layers (plan.recurrent != kNone; src/cpu/recurrent_layer.h). C = conv_channels.
  Linear ssm_in;                   // Mamba-2: n_embd -> z | xBC | dt (d_inner + C + n_head)
  Linear ssm_qkv;                  // delta net: n_embd -> q | k | v (C)   (attn_qkv)
  Linear ssm_z;                    // delta net: n_embd -> z (d_inner)     (attn_gate)
  Linear ssm_beta, ssm_alpha;      // delta net: n_embd -> n_v_head each (qwen35)
  Linear ssm_ba;                   // fused alternative: n_embd -> per key head [beta | alpha] (qwen3next)
  const float* ssm_conv1d = nullptr;   // [C][d_conv]: channel c's taps, oldest input first
  const float* ssm_conv1d_b = nullptr; // [C] or null
  const float* ssm_dt_b = nullptr;     // [n_v_head]: dt_bias
  const float* ssm_a = nullptr;        // [n_v_head]: -exp(A_log), as the converters store it
  const float* ssm_d = nullptr;        // [n_v_head]: Mamba-2 skip D
  const float* ssm_norm = nullptr;     // [head_v_dim] (delta net) or [d_inner] (Mamba-2, grouped)
  Linear ssm_out;                  // d_inner -> n_embd
};

struct Weights {
  const TensorView* tok_embd = nullptr;  // {n_embd, n_vocab}
  Norm embd_norm;                        // bloom
  Norm output_norm;
  Linear output;                         // {n_embd, n_vocab}; tok_embd when tied
  const float* rope_freqs = nullptr;     // [n_rot/2] frequency divisors, when the plan uses them
  std::vector<LayerWeights> layers;

  // Owned f32 copies of 1-D tensors stored in 16-bit types (deque: stable addresses).
  std::deque<std::vector<float>> owned;
};

// Loads tensors by GGUF name and checks each shape exactly. Required tensors that are
// missing, or any tensor of the wrong shape or an unsupported type, are bad input
// (frink::Error naming the tensor).
class WeightLoader {
 public:
  WeightLoader(const ModelFile& file, Weights& out) : file_(file), out_(out) {}

  // name is the full GGUF name ("blk.3.attn_q.weight"); shape in ggml order.
  const TensorView* matrix(const std::string& name, std::vector<int64_t> shape, bool required);
  const float* vector(const std::string& name, int64_t n, bool required);
  Norm norm(const std::string& base, int64_t n, bool with_bias, bool required);
  // base.weight {n_in, n_out} [+ base.bias when `bias`] [+ base.scale when `scale`], as an
  // attention projection (Wx * s + b) or, with `ffn`, an FFN one ((Wx + b) * s).
  struct LinearOpts {
    bool bias = false;
    bool scale = false;
    bool ffn = false;
    bool required = true;
  };
  Linear linear(const std::string& base, int64_t n_in, int64_t n_out, LinearOpts opts);
  // base.weight {n_in, n_out, n_expert} [+ base.bias {n_out, n_expert} when `bias`]
  // [+ base.scale {n_expert} when `scale`].
  Experts experts(const std::string& base, int64_t n_in, int64_t n_out, int64_t n_expert, LinearOpts opts);
  // A per-tensor scalar (shape {1}) or `fallback` when absent.
  float scalar(const std::string& name, float fallback);

 private:
  const ModelFile& file_;
  Weights& out_;
};

std::string blk(int64_t layer, const char* what);  // "blk.<layer>.<what>"

}  // namespace frink
