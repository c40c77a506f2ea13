// Attention on the device against a sequence's KV mirror (src/cuda/kv_mirror.h), for
// decode (n_tok = 1) and causal prefill (n_tok > 1) alike: query t at position pos0 + t sees
// mirror rows [0, pos0 + t]. Prompts of kAttnPrefillMinTok or more queries use a tiled
// kernel (attention.cu): on tensor cores (f16 inputs, f32 accumulate) from kAttnMmaMinTok
// queries with head dim 64 or 128, exact f32 otherwise. Otherwise split-K over the sequence (flash-decoding): the keys are cut
// into chunks of kAttnChunk, each (token, head or group of heads sharing a KV head, chunk)
// block computes a partial softmax (max, sum, weighted V), and a second kernel merges the
// chunks, so a long context keeps every SM busy at batch 1. GQA (n_head a multiple of
// n_head_kv), a logit softcap, sliding windows, ALiBi and attention sinks are supported, each
// as the host body (cpu/layer_body.cpp attend) has it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

// Keys per tile in decode (n_tok < kAttnPrefillMinTok; 16 or 32 at short contexts, see
// attn_split): small, so a long context gives
// thousands of blocks each costing one memory round trip (decode at depth is then bandwidth
// bound). Larger batches that take split-K (head dims above 128) use 8 such tiles per split,
// as the partial scratch grows with n_tok x splits; attn_scratch_floats has the sizing.
inline constexpr int64_t kAttnChunk = 64;
inline constexpr int64_t kAttnMaxHeadDim = 256;
// Batches of at least this many queries (and head dims up to 128) take the tiled prefill
// kernel, which shares each key tile among 8 queries; smaller ones the split-K kernel.
inline constexpr int64_t kAttnPrefillMinTok = 8;
// Batches of at least this many queries with head_dim_k == head_dim_v in {64, 128} take the
// tensor-core prefill kernel (f16 Q/K/V/P, f32 accumulate and softmax: NMSE ~1e-6 against f32,
// see tests/gpu/attention_test.cpp); smaller batches keep the exact f32 tiled kernel, where a
// 64-row tile would be mostly empty anyway.
inline constexpr int64_t kAttnMmaMinTok = 128;

struct AttnParams {
  const float* q = nullptr;   // [n_tok][q_stride]: heads of head_dim_k, post-RoPE/QK-norm
  int64_t q_stride = 0;
  const float* k = nullptr;   // mirror [capacity][n_head_kv * head_dim_k]
  const float* v = nullptr;   // mirror [capacity][n_head_kv * head_dim_v]
  float* out = nullptr;       // [n_tok][n_head * head_dim_v]
  int64_t n_tok = 0;
  const int32_t* pos = nullptr;  // device int pos0: query t sees keys [0, pos0 + t]
  int64_t max_keys = 0;          // host bound on pos0 + n_tok, which sizes the split grid: a
                                 // token graph passes a power of two of the length, so the
                                 // splits past the real length idle and one graph serves
                                 // every length up to that bound
  int64_t n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  float scale = 1.0f;         // multiplies Q.K
  float softcap = 0.0f;       // > 0: scores -> c * tanh(scores / c)
  int64_t window = 0;         // > 0: a query at pos sees keys j with pos - j < window only
  const float* alibi_slopes = nullptr;  // [n_head] or null: score -= slope[h] * (pos - j)
  const float* sinks = nullptr;         // [n_head] or null: an extra logit in each softmax's
                                        // denominator (gpt-oss), weighting no value
  float* partial = nullptr;   // scratch of attn_scratch_floats(...) floats
  // Optional (null: off): out ALSO as Q8_0 blocks, in the layout the next product reads them
  // (matmul.cuh q8_0_act, n_in = n_head * head_dim_v): out_q8 int8 [n_tok][n_head * head_dim_v],
  // out_d8 f32 [n_tok][n_head * head_dim_v / 32], from out's values with act_prep.cu's
  // arithmetic, bit for bit (q8_0_rule.cuh), so the wo product skips its quantize kernel.
  // Written by the split-K merge, a block per (token, head): only where attn_writes_q8_0, so
  // blocks never straddle heads; launch_attention fails (cudaErrorInvalidValue) elsewhere.
  // With out_sum set, Q8_K blocks instead (matmul.cuh Q8KAct: out_q8 the quants, out_d8
  // f32 [n_tok][n / 256], out_sum int32 [n_tok][n / 32]), only where attn_writes_q8k: a merge
  // block then holds the 256 / head_dim_v heads of one 256-block.
  int8_t* out_q8 = nullptr;
  float* out_d8 = nullptr;
  int32_t* out_sum = nullptr;
  // Optional (null: off; not with out_q8): out ALSO rounded to bf16 (out_round_bf16) or f16,
  // kept as f32 [n_tok][n_head * head_dim_v], as an F16 / BF16 wo product on the decode path
  // reads it (matmul_reads_rounded16; round16_rule.cuh), so its act_round launch goes. Written by
  // the split-K merge: only where attn_uses_split_k; launch_attention fails elsewhere.
  float* out_round = nullptr;
  bool out_round_bf16 = false;
  cudaStream_t stream = nullptr;
};

// Whether launch_attention takes the split-K kernels (which need the partial scratch) for
// this batch and head shape, rather than the tiled prefill kernel.
bool attn_uses_split_k(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v);
// Whether launch_attention can also write its output as Q8_0 blocks (AttnParams::out_q8):
// split-K (its merge writes them) and head_dim_v a multiple of 32 (a block is one head's).
bool attn_writes_q8_0(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v);
// The same for Q8_K blocks (AttnParams::out_sum): split-K, head_dim_v 64, 128 or 256, and the
// heads a whole number of 256-blocks.
bool attn_writes_q8k(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v, int64_t n_head);
// Whether a prefill batch (not split-K) of this shape takes the tensor-core kernel (when the
// device is sm_80+ and the mirrors 16-byte aligned; otherwise the f32 tiled kernel, which
// takes head dims up to 128 only). Features (windows, ALiBi, sinks, softcap, GQA) are all
// handled there.
bool attn_uses_tensor_cores(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v);
// Scratch floats (AttnParams::partial) a batch of this shape needs for a grid sized by
// max_keys: the split-K partials, or the tensor-core prefill's f16 copy of the K/V rows it
// reads (none for the f32 tiled kernel).
size_t attn_scratch_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
                           int64_t head_dim_v);
// Keys per tile and per split that launch_attention gives a split-K batch with these
// parameters on the current device: for decode batches one tile of 16 or 32 at short contexts
// (grids of at most 32 such splits), two of 32 between, and against the longest contexts
// 32-key tiles in even_splits splits (split_keys 0: each token's tiles shared out evenly over
// them); 8 of 64 for prefill-sized batches (head dims above 128).
struct AttnSplit {
  int64_t tile_keys, split_keys, even_splits;
};
AttnSplit attn_split(const AttnParams& p);
void launch_attention(const AttnParams& p);

// The batch's new K/V rows ([n_tok][k_width], [n_tok][v_width]) into the mirror at rows
// [*pos, *pos + n_tok), and the same rows to stage_k/stage_v ([n_tok][width], on their way to
// the host cache). A kernel rather than a memcpy because the destination moves with the
// position, which a replayed graph reads from device memory.
void launch_kv_append(const float* k, const float* v, int64_t k_width, int64_t v_width, int64_t n_tok,
                      const int32_t* pos, float* mirror_k, float* mirror_v, float* stage_k, float* stage_v,
                      cudaStream_t stream);

}  // namespace frink::cuda
