// The host layer bodies: the reference forward pass every other path is tested against.
// Written to be checked by eye against the transformers modeling files; each step names
// the PyTorch line it reproduces.
//
// The residual stream x is [n_tok][n_embd] for tokens at positions [pos0, pos0 + n_tok) of
// one sequence; positions equal KV cache row indices, so the caller guarantees
// cache.rows() == pos0 on entry. On return the layer's K/V rows for those tokens are
// appended (cache.rows() == pos0 + n_tok) and x holds the layer's output.
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace frink::cpu {

void attention_layer(const Model& m, int64_t il, KvCache& cache, float* x, int64_t n_tok,
                     int64_t pos0, ThreadPool& pool);

// The layer's feed-forward block, dense or mixture of experts, on normed input
// h [n_tok][n_embd] -> out [n_tok][n_embd] (the recurrent layer bodies share it).
void feed_forward(const Model& m, const LayerPlan& p, const LayerWeights& w, const float* h, int64_t n_tok,
                  float* out, ThreadPool& pool);

// x [n_tok][n_embd] -> embeddings of tokens (scaled/normed as the plan says).
void embed_tokens(const Model& m, const int32_t* tokens, int64_t n_tok, float* x);

// Final norm and output projection for the n_tok rows of x: logits [n_tok][n_vocab].
void output_logits(const Model& m, const float* x, int64_t n_tok, float* logits, ThreadPool& pool);

}  // namespace frink::cpu
