#include "cpu/matmul.h"

#include <algorithm>

#include "core/error.h"
#include "quant/quant.h"

namespace frink::cpu {

namespace {
// Weight rows per tile. 16 rows of a 2048-wide Q4_0 matrix are ~18 KB: the tile and one
// activation row fit in L1/L2 while every token of a prompt batch passes over it.
constexpr int64_t kRowTile = 16;
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
  const int64_t n_tiles = (n_out + kRowTile - 1) / kRowTile;
  pool.parallel_for(n_tiles, [&](int64_t b0, int64_t b1, int) {
    float tmp[kRowTile];
    for (int64_t tile = b0; tile < b1; ++tile) {
      const int64_t r0 = tile * kRowTile;
      const int64_t nr = std::min(kRowTile, n_out - r0);
      for (int64_t t = 0; t < n_tok; ++t) {
        vec_dot_rows(w.type, w.row(r0), w_stride, nr, act.data() + static_cast<size_t>(t) * act_bytes, n_in, tmp);
        std::copy(tmp, tmp + nr, y + t * n_out + r0);
      }
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
