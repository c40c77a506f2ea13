// Synthetic models: GGUF files with random weights and EXACTLY the tensor names, shapes and
// metadata of a real model (llama.cpp's names and keys), written directly in the requested
// block type, so full-size benchmarks need no download (DESIGN.md section 7).
//
// Invariants:
//  - Names, shapes and keys follow llama.cpp's loader for the architecture (src/models/<arch>.cpp
//    upstream), including the families frink's host path cannot run yet (qwen3moe, qwen3next,
//    qwen35, gpt-oss): such a file must load in llama.cpp.
//  - Weights are reproducible from (preset, type, layers, seed) alone, whatever the thread
//    count: every row draws from its own generator seeded by (seed, tensor, row).
//  - Tensor data are generated and quantized at write time, one tensor at a time, through
//    GgufWriter's fill callback: the largest buffer held is one tensor.
//  - Statistics keep activations finite through every layer: input projections N(0, 1/n_in),
//    output projections (attn_output, ffn_down, ssm_out) N(0, 0.25/(n_in*n_layer)), norms 1 +
//    N(0, 0.02^2), embeddings N(0, 1/n_embd) (so tied logits have unit scale).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf_writer.h"
#include "format/metadata.h"
#include "quant/ggml_type.h"

namespace frink {

// Which tensor layout a preset writes (one per llama.cpp loader it imitates).
enum class SynthFamily { kLlama, kQwen2, kQwen3, kGemma3, kQwen3Moe, kQwen2Moe, kQwen3Next, kQwen35, kGptOss, kDeepseek2 };

struct SynthPreset {
  std::string_view name;   // "llama3.1-8b"
  std::string_view arch;   // general.architecture
  std::string_view model;  // the Hugging Face model it copies, for general.name
  SynthFamily family;
  int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
  int64_t n_rot;           // rotated dims of a head (< head_dim: partial rotary)
  double rope_base, norm_eps;
  bool tied;               // output.weight absent: logits use token_embd
  // Llama-3 rope scaling, written as the rope_freqs tensor (factor 0: none).
  double llama3_factor = 0, llama3_low = 1, llama3_high = 4;
  int64_t rope_orig_ctx = 0;
  std::string_view rope_scaling = "";  // "linear" / "yarn" keys, or "" for none
  double rope_scaling_factor = 0;
  int64_t sliding_window = 0;
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  // Gated delta net (qwen3next, qwen35): a full-attention layer every `full_attn_interval`.
  int64_t full_attn_interval = 0, ssm_conv = 0, ssm_state = 0, ssm_groups = 0, ssm_v_heads = 0;
  // DeepSeek-2 (multi-head latent attention; head_dim is then both qk_nope and the value head):
  // the compressed kv's width, the q LoRA's (0: one plain attn_q), leading dense layers, and
  // the shared experts (each n_ff_exp wide).
  int64_t kv_lora_rank = 0, q_lora_rank = 0, n_leading_dense = 0, n_shared_exp = 0;
  double yarn_log_mul = 0;  // rope.scaling.yarn_log_multiplier (0.1 * mscale_all_dim)
  // DeepSeek's routing: expert_gating_func as the file writes it (1: softmax, V2; 2: sigmoid with
  // an exp_probs_b selection bias, V3), expert_weights_norm / _scale, group-limited top-k (0: none).
  int expert_gating = 1;
  bool expert_norm = false;
  double expert_scale = 1.0;
  int64_t n_expert_group = 0, n_expert_group_used = 0;
};

const std::vector<SynthPreset>& synth_presets();
const SynthPreset* find_synth_preset(std::string_view name);  // null when unknown

struct SynthOptions {
  std::string preset;
  // F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (every matrix that type:
  // llama-quantize --pure), Q4_K_M / Q5_K_M (llama.cpp's mixes), MXFP4 (expert tensors
  // MXFP4, other matrices Q8_0, as gpt-oss ships), or any type the quant layer cannot
  // write (IQ4_XS), which is refused with a clear error.
  std::string type = "Q4_0";
  int64_t n_layer = 0;     // 0: the preset's own
  uint64_t seed = 42;
  int n_threads = 0;       // 0: one per core
};

// How one tensor is drawn.
enum class SynthInit {
  kNormal,     // mean + std * N(0, 1)
  kRopeFreqs,  // Llama-3 frequency factors (exact, as convert_hf_to_gguf.py computes them)
  kMxfp4,      // random MXFP4 blocks with roughly `std` spread (no MXFP4 quantizer exists)
};

struct SynthTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  GgmlType type;
  SynthInit init = SynthInit::kNormal;
  float mean = 0.0f, std = 0.0f;
};

// Everything a synthetic file holds except the tensor bytes.
struct SynthPlan {
  const SynthPreset* preset = nullptr;
  int64_t n_layer = 0;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, MetaValue>> meta;  // in write order
  std::vector<SynthTensor> tensors;
  int64_t n_params() const;
  size_t n_bytes() const;   // tensor data
};

// Throws frink::Error on an unknown preset or type, or a type the quant layer cannot write.
SynthPlan plan_synth(const SynthOptions& opts);

// Writes the plan's file (tensors generated and quantized with opts.n_threads threads).
void write_synth(const SynthPlan& plan, const std::string& path, int n_threads);

// The bytes of tensor `index` (tests; write_synth streams the same bytes).
std::vector<uint8_t> synth_tensor_bytes(const SynthPlan& plan, size_t index, int n_threads);

}  // namespace frink
