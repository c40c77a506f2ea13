#include "cpu/matmul.h"

#include <algorithm>

#include "core/error.h"
#include "quant/quant.h"

namespace frink::cpu {

namespace {
// Decode (one token): weight rows per job. 16 rows of a 2048-wide Q4_0 matrix are ~18 KB.
constexpr int64_t kRowTile = 16;
// Prompt (several tokens): a job is a block of kBlockRows weight rows x kBlockTokens
// tokens done by ONE vec_dot_tile call, which walks register tiles of a few rows across
// the block's tokens. 64 x 64 at n_in = 2048: 74 KB of Q4_0 rows and 139 KB of Q8_0
// activations, both stay in the 1 MB L2 while the block is done; jobs are numbered
// row-block major, so a thread's consecutive jobs reuse the same rows.
constexpr int64_t kBlockRows = 64, kBlockTokens = 64;
}  // namespace

void matmul(const TensorView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  const int64_t n_in = w.ne[0];
  const int64_t n_out = w.n_rows();
  const GgmlType act_type = vec_dot_type(w.type);
  const size_t act_bytes = ggml_row_bytes(act_type, n_in);
  std::vector<uint8_t> act(act_bytes * static_cast<size_t>(n_tok));
  pool.parallel_for(n_tok, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      quantize_row(act_type, x + t * n_in, act.data() + static_cast<size_t>(t) * act_bytes, n_in);
  });
  const size_t w_stride = w.row_bytes();
  if (n_tok == 1) {
    const int64_t n_tiles = (n_out + kRowTile - 1) / kRowTile;
    pool.parallel_for(n_tiles, [&](int64_t b0, int64_t b1, int) {
      for (int64_t tile = b0; tile < b1; ++tile) {
        const int64_t r0 = tile * kRowTile;
        vec_dot_rows(w.type, w.row(r0), w_stride, std::min(kRowTile, n_out - r0), act.data(), n_in, y + r0);
      }
    });
    return;
  }
  const int64_t n_row_blocks = (n_out + kBlockRows - 1) / kBlockRows;
  const int64_t n_tok_blocks = (n_tok + kBlockTokens - 1) / kBlockTokens;
  pool.parallel_for(n_row_blocks * n_tok_blocks, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t r0 = (j / n_tok_blocks) * kBlockRows, t0 = (j % n_tok_blocks) * kBlockTokens;
      vec_dot_tile(w.type, w.row(r0), w_stride, std::min(kBlockRows, n_out - r0),
                   act.data() + static_cast<size_t>(t0) * act_bytes, act_bytes, std::min(kBlockTokens, n_tok - t0),
                   n_in, y + t0 * n_out + r0, static_cast<size_t>(n_out));
    }
  });
}

void linear(const Linear& l, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  matmul(*l.w, x, n_tok, y, pool);
  const int64_t n_out = l.n_out();
  auto add_bias = [&] {
    if (l.b)
      for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t r = 0; r < n_out; ++r) y[t * n_out + r] += l.b[r];
  };
  if (l.bias_before_scale) add_bias();
  if (l.scale != 1.0f)
    for (int64_t i = 0; i < n_tok * n_out; ++i) y[i] *= l.scale;
  if (!l.bias_before_scale) add_bias();
}

void embedding_row(const TensorView& emb, int64_t id, float* out) {
  FRINK_ASSERT(id >= 0 && id < emb.n_rows(), "token id {} outside the vocabulary", id);
  dequantize_row(emb.type, emb.row(id), out, emb.ne[0]);
}

}  // namespace frink::cpu
