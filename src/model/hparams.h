// Hparams: one model's hyper-parameters, read with exactly the GGUF keys its architecture
// defines (llama.cpp's names and semantics), and the LayerPlan: what each layer is.
// Files carry many keys an architecture does not read (llama.cpp's test models set a
// softcap on llama, for instance); only the architecture's own reader (src/model/arch_*.cpp)
// decides which keys mean something, so an unused key can never change a result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace frink {

enum class NormKind { kRms, kLayer };                 // RMSNorm, or LayerNorm with bias
enum class RopeKind { kNone, kNorm, kNeox };          // kNorm rotates adjacent pairs (x0,x1),
                                                      // kNeox pairs (x_i, x_{i+d/2})
enum class Activation { kSilu, kGeluTanh };
// kGated: down(act(gate x) * up x); kGatedFused: the same with gate|up stacked in one
// 2*n_ff-wide ffn_up (phi3); kPlain: down(act(up x)).
// kMoe: a mixture of experts (LayerPlan::moe), possibly with a shared expert.
enum class FfnKind { kGated, kGatedFused, kPlain, kMoe };

// What computes a layer's attention. kGqa: per-head q/k/v projections, a cache of per-head
// K and V rows. kMla: DeepSeek-2/3 multi-head latent attention (LayerPlan::mla,
// src/cpu/mla_attention.h), whose cache holds ONE compressed row per token.
enum class AttnKind { kGqa, kMla };

// Multi-head latent attention's extra widths. The plan's head_dim_k is the query head
// (qk_nope + rope.n_rot, llama.cpp's n_embd_head_k_mla), head_dim_v the decompressed value
// head (n_embd_head_v_mla); n_head_kv is 1 (with absorption MLA is MQA over the latent).
struct MlaPlan {
  int64_t q_lora_rank = 0;       // wq_a -> q_a_norm -> wq_b; 0: one plain wq (the "lite" models)
  int64_t kv_lora_rank = 0;      // width of the compressed kv the cache stores
};

// How router logits become expert weights (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*).
enum class ExpertGating {
  kSoftmax,        // softmax over all experts; top-k of those probabilities are the weights
  kSigmoid,        // sigmoid of each logit (DeepSeek-V3 style, usually with exp_probs_b)
  kSoftmaxWeight,  // top-k of the raw logits, then softmax over the k chosen (gpt-oss)
};

// A mixture-of-experts feed-forward block (src/cpu/moe.h computes it). Selection ranks
// probs + exp_probs_b (when the layer has that bias) but the weights use the unbiased probs.
struct MoePlan {
  int64_t n_expert = 0, n_expert_used = 0;
  int64_t n_ff_exp = 0;          // each routed expert's hidden width
  int64_t n_ff_shexp = 0;        // the shared expert's hidden width; 0 = no shared expert
  ExpertGating gating = ExpertGating::kSoftmax;
  bool norm_w = false;           // weights / max(sum of the k weights, 6.1e-5)
  float w_scale = 1.0f;          // weights * w_scale (expert_weights_scale; 0 read as 1)
  bool swiglu_oai = false;       // gpt-oss: min(g,7) * sigmoid(1.702 min(g,7)) * (clamp(u,+-7) + 1)
  bool shexp_gate = false;       // shared expert output * sigmoid(ffn_gate_inp_shexp . x) (qwen2moe)
  // Group-limited routing (DeepSeek-V3, expert_group_count > 1): experts form n_group equal
  // groups, a group scores the sum of its best two (biased) probabilities, and only the
  // best n_group_used groups' experts may be chosen. 0 = off.
  int64_t n_group = 0, n_group_used = 0;
  // Whether the groups limit the choice at all (more than one, not all of them kept).
  bool group_limited() const { return n_group > 1 && n_group_used < n_group; }
};

struct RopeParams {
  RopeKind kind = RopeKind::kNone;
  int64_t n_rot = 0;             // rotated dims of each head (partial rotary when < head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;       // positions are multiplied by this (linear scaling: 1/factor)
  // YaRN (ggml's rope_yarn); ext_factor 0 disables it.
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;
  bool use_freq_factors = false; // divide each pair's frequency by rope_freqs.weight[i]
  // YaRN ramp ends rounded outward (floor/ceil), as ggml always does; transformers' YaRN
  // with rope_parameters.truncate = false (gpt-oss) keeps them fractional.
  bool yarn_truncate = true;
};

// What replaces attention in a recurrent layer (hybrid models; src/cpu/recurrent_layer.h).
enum class RecurrentKind {
  kNone,           // an attention layer
  kGatedDeltaNet,  // Qwen3-Next / Qwen3.5 linear attention: conv, L2-normed q/k, gated delta rule
  kMamba2,         // Mamba-2 SSD layer (granitehybrid)
};

// A recurrent layer's shapes, read from the ssm.* keys (llama.cpp's ssm_d_conv, ssm_d_inner,
// ssm_d_state, ssm_dt_rank, ssm_n_group).
struct SsmPlan {
  int64_t d_conv = 0;    // causal convolution width; the state keeps the last d_conv - 1 inputs
  int64_t d_inner = 0;   // value width: n_v_head * head_v_dim (delta net), n_head * head_dim (Mamba-2)
  int64_t d_state = 0;   // key head width (delta net) or SSM state size per head (Mamba-2)
  int64_t n_v_head = 0;  // value heads (delta net) or SSM heads (Mamba-2): ssm.time_step_rank
  int64_t n_group = 0;   // key heads (delta net) or B/C groups (Mamba-2): ssm.group_count
  // Delta net with n_v_head > n_group: value head h reads key head h % n_group when true
  // (llama.cpp's qwen35 graphs, whose converter reorders the value heads), else
  // h / (n_v_head / n_group) (transformers' repeat_interleave, llama.cpp's qwen3next).
  bool kv_head_tiled = false;
  // Channels through the convolution: q|k|v (delta net) or x|B|C (Mamba-2), the same sum.
  int64_t conv_channels() const { return d_inner + 2 * n_group * d_state; }
  int64_t head_v_dim() const { return n_v_head ? d_inner / n_v_head : 0; }
};

struct LayerPlan {
  AttnKind attn = AttnKind::kGqa;
  MlaPlan mla;                   // when attn == kMla
  int64_t n_head = 0, n_head_kv = 0;
  int64_t head_dim_k = 0, head_dim_v = 0;
  int64_t window = 0;            // sliding window: a query at p sees keys in (p - window, p];
                                 // 0 = full causal attention
  RopeParams rope;
  float attn_scale = 0.0f;       // multiplies Q.K (set by the arch reader, never 0 after load)
  float attn_softcap = 0.0f;     // scores -> c * tanh(scores / c) when > 0
  bool alibi = false;            // ALiBi position bias (bloom)
  bool qk_norm = false;          // RMSNorm on each head of q and k before RoPE (qwen3, gemma3)
  bool post_attn_norm = false;   // sandwich norms (gemma2/3): norm the branch output
  bool post_ffn_norm = false;
  bool parallel_residual = false;// x + attn(n(x)) + ffn(n'(x)) (falcon, phi2-style)
  bool qk_norm_full = false;     // RMSNorm over all of q and all of k (olmoe), not per head
  bool attn_sinks = false;       // per-head learned logit in the softmax denominator (gpt-oss)
  FfnKind ffn = FfnKind::kGated;
  Activation act = Activation::kSilu;
  int64_t n_ff = 0;
  MoePlan moe;                   // when ffn == kMoe
  // Floats per token in the layer's KvCache. GQA: per-head K and V rows. MLA: one row
  // [kv_lora_rank compressed kv | n_rot roped k_pe] and no V row: V is the row's first
  // kv_lora_rank floats (KvCache's v_width 0).
  int64_t cache_k_width() const { return attn == AttnKind::kMla ? mla.kv_lora_rank + rope.n_rot : n_head_kv * head_dim_k; }
  int64_t cache_v_width() const { return attn == AttnKind::kMla ? 0 : n_head_kv * head_dim_v; }
  // Hybrid models. A recurrent layer has no KV cache (n_head may be 0); its state lives in
  // the session's RecurrentState.
  RecurrentKind recurrent = RecurrentKind::kNone;
  SsmPlan ssm;                   // when recurrent != kNone
  bool attn_out_gate = false;    // wq is double width, per head [q | gate]; the attention
                                 // output is multiplied by sigmoid(gate) before wo (Qwen3-Next)
};

struct Hparams {
  std::string arch;              // general.architecture
  std::string name;              // general.name, for logs
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ctx_train = 0;
  NormKind norm = NormKind::kRms;
  float norm_eps = 1e-5f;
  float embd_scale = 0.0f;       // inputs multiplied by this when > 0 (gemma: sqrt(n_embd))
  bool embd_norm = false;        // LayerNorm right after the embedding (bloom)
  float final_softcap = 0.0f;    // logits -> c * tanh(logits / c) when > 0
  float max_alibi_bias = 0.0f;
  // Granite's residual_scale and logit_scale (0 = none); the loader folds both into output
  // scales of the weights (arch_granite_hybrid.cpp), so the host bodies never read them.
  float residual_scale = 0.0f, logit_scale = 0.0f;
  std::vector<LayerPlan> layers;

  int64_t max_kv_width() const;  // widest n_head_kv * head_dim over layers
};

}  // namespace frink
