// Host matrix products: Y[t] = W X[t] for a batch of token rows, W in any block type.
// Each input row is converted ONCE to the activation format the weight type's dot product
// takes (8-bit blocks for quantized weights, as llama.cpp's CPU backend does). One token
// (decode): threads split the weight rows (vec_dot_rows). Several tokens (prompt): threads
// split blocks of rows x tokens, each done by vec_dot_tile, which decodes a weight block
// once for several tokens. Both give every element bit-identical to vec_dot, so a token's
// output does not depend on the batch it came in.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "format/model_file.h"
#include "model/weights.h"

namespace frink::cpu {

// y[t * n_out + r] = dot(W row r, x[t * n_in ...]) for t < n_tok.
void matmul(const TensorView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool);
// The same, then * l.scale and + l.b.
void linear(const Linear& l, const float* x, int64_t n_tok, float* y, ThreadPool& pool);

// Row `id` of an embedding matrix {n_embd, n_vocab}, dequantized into out[n_embd].
void embedding_row(const TensorView& emb, int64_t id, float* out);

}  // namespace frink::cpu
