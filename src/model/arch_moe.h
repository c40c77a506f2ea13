// Readers shared by the mixture-of-experts architectures (arch_moe.cpp, arch_llama.cpp,
// arch_gpt_oss.cpp, and the DeepSeek / Qwen3-Next families built on them): the expert keys
// and the expert tensor groups, with llama.cpp's names and meanings.
#pragma once

#include <cstdint>

#include "format/metadata.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace frink::arch {

// What an architecture's graph fixes about its experts (llama.cpp hard-codes these per
// architecture in the build_moe_ffn call; the GGUF keys of the same names are not read).
struct MoeSpec {
  ExpertGating gating = ExpertGating::kSoftmax;
  bool norm_w = false;
  bool swiglu_oai = false;
  bool shexp_gate = false;
  // The experts' width: expert_feed_forward_length when the file has it (and it is not 0),
  // else feed_forward_length / n_expert_used (qwen2moe, qwen3moe); with !read_n_ff_exp it is
  // feed_forward_length (llama, olmoe). required: the key must be there (gpt-oss).
  bool read_n_ff_exp = true;
  bool n_ff_exp_required = false;
  bool ff_div_used = true;
  // The shared expert's width: expert_shared_feed_forward_length, else feed_forward_length;
  // only when has_shexp.
  bool has_shexp = false;
  // Layers [0, n_leading_dense) keep a dense FFN of feed_forward_length (the key
  // leading_dense_block_count is read by the DeepSeek family, which sets this from it).
  int64_t n_leading_dense = 0;
};

// Reads expert_count, expert_used_count, expert widths and expert_weights_scale, and makes
// every layer from n_leading_dense on a kMoe layer. Bad counts are bad input (frink::Error).
void read_moe(const Metadata& meta, Hparams& hp, const MoeSpec& spec);

// Which optional expert tensors the architecture's graph applies.
struct MoeTensors {
  bool exps_scale = false;     // ffn_{gate,up,down}_exps.scale {n_expert}
  bool exps_bias = false;      // ffn_{gate,up,down}_exps.bias {n_ff | n_embd, n_expert}
  bool router_bias = false;    // ffn_gate_inp.bias {n_expert}
  bool probs_bias = false;     // exp_probs_b.bias {n_expert}
  bool fused_gate_up = false;  // ffn_gate_up_exps when present, instead of gate and up
};

// ffn_norm is loaded by the caller. Loads the router, the experts and (plan.moe.n_ff_shexp
// > 0) the shared expert with its gate when plan.moe.shexp_gate.
void load_moe(const Hparams& hp, WeightLoader& ld, int64_t il, LayerWeights& l, const MoeTensors& t);

}  // namespace frink::arch
