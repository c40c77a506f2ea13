// DeepSeek-2/3 multi-head latent attention (MLA) on the host, computed as llama.cpp does
// for files that carry the split wk_b / wv_b ("MLA with absorption", src/models/deepseek2.cpp,
// is_mla branch, and build_attn_mha's v_mla step). Per token at position pos:
//
//   q       = wq_b(q_a_norm(wq_a h))   (or wq h)        [H][nope | rope]
//   kv      = wkv_a_mqa h                                [R | rope]
//   c       = kv_a_norm(kv[:R])                          the compressed kv
//   k_pe    = rope(kv[R:], pos);  q_pe = rope(q[h][nope:], pos)   (one k_pe for all heads)
//   q_abs_h = wk_b_h q_nope_h                            [H][R]   (k_nope never exists)
//   cache  <- [c | k_pe]                                 R + n_rot floats, ONE row per token
//   s_hj    = [q_abs_h | q_pe_h] . cache_j * attn_scale  for j <= pos; a_h = softmax(s_h)
//   o_h     = wv_b_h (sum_j a_hj c_j)                    [H][head_dim_v]  (V is cache_j[:R])
//   out     = wo o                                       (* wo's scale)
//
// This equals the expanded multi-head form (k_nope_j = wk_b^T c_j, v_j = wv_b c_j per head)
// up to rounding; tests/engine/mla_logits_test.cpp checks both that and llama.cpp's logits.
// The layer's KvCache has k_width R + n_rot and v_width 0 (LayerPlan::cache_k_width).
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace frink::cpu {

// h [n_tok][n_embd] (the attention input, already normed) for positions [pos0, pos0 + n_tok)
// -> out [n_tok][n_embd], the attention branch after wo. Requires plan.attn == kMla and
// cache.rows() == pos0; appends the n_tok compressed rows.
void mla_attention(const Model& m, int64_t il, KvCache& cache, const float* h, int64_t n_tok, int64_t pos0,
                   float* out, ThreadPool& pool);

}  // namespace frink::cpu
