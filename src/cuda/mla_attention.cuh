// Multi-head latent attention's softmax on the device (DeepSeek-2/3 with absorption; the host's
// attend_latent in cpu/mla_attention.cpp): every head's query [c_q | q_pe] (width W = rank +
// n_rot) against ONE cache row per token [c | k_pe], whose first `rank` floats are also the
// value. Why a kernel of its own rather than attention.cuh's: its rows are 576 wide in the
// released models (past kAttnMaxHeadDim), V lives inside the K row, and every head reads the
// same row, so a block takes 8 heads of one token over a run of keys and each row it loads
// serves all 8.
//
// Decode batches (n_tok < kAttnPrefillMinTok) cut the keys into splits (flash-decoding) and a
// merge kernel combines them, so a long context keeps the SMs busy; prompt batches give each
// (token, 8 heads) one block over all its keys, scored a key a lane, and write the output
// directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/rope.cuh"

namespace frink::cuda {

// Widths the kernels hold: a lane keeps W / 32 query floats and rank / 32 accumulators in
// registers (DeepSeek-V2/V3 and Kimi-K2: 576 and 512); rows of whole float4 (W % 4 == 0).
inline constexpr int64_t kMlaMaxWidth = 640, kMlaMaxRank = 512;

struct MlaAttnParams {
  const float* q = nullptr;     // [n_tok][n_head][width], post-RoPE, absorbed
  const float* rows = nullptr;  // mirror [capacity][width]
  float* out = nullptr;         // [n_tok][n_head][rank]
  int64_t n_tok = 0, n_head = 0, width = 0, rank = 0;
  const int32_t* pos = nullptr;  // device int pos0: query t sees rows [0, pos0 + t]
  int64_t max_keys = 0;          // host bound on pos0 + n_tok (sizes the split grid, as AttnParams')
  float scale = 1.0f;            // multiplies q . row
  float* partial = nullptr;      // mla_scratch_floats(...) floats
  // Optional (null: off): out ALSO as Q8_0 blocks in q8_0_act's layout over n_tok * n_head rows
  // of rank (int8 [rows][rank], then f32 [rows][rank / 32]), as the wv_b product reads them, by
  // the host's rule (q8_0_rule.cuh), so that product skips its quantize launch. rank % 32 == 0.
  int8_t* out_q8 = nullptr;
  float* out_d8 = nullptr;
  cudaStream_t stream = nullptr;
};

bool mla_attention_supported(int64_t width, int64_t rank);
size_t mla_scratch_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t rank);
void launch_mla_attention(const MlaAttnParams& p);

// What a latent layer does between its input products and its attention, in one launch (a
// decode layer's chain pays each launch, 2-5 us on the H200): every head's q_pe rotated into
// its absorbed query's tail, optionally its q_nope as the wk_b product's Q8_0 input, and the
// cache row's c normed (kv_a_norm) and k_pe rotated, the row appended to the mirror at *pos + t
// and to the staging. Replaces a rope launch, a norm, the append, a copy and a quantize launch.
struct MlaPrepParams {
  const float* q = nullptr;      // [n_tok][n_head][head_dim]: [nope | rope] a head
  const float* kv = nullptr;     // [n_tok][rank + n_rot]: [c | k_pe] as wkv_a_mqa wrote them
  const float* kv_norm_w = nullptr;  // [rank] or null
  float eps = 0.0f;
  float* q_abs = nullptr;        // [n_tok][n_head][rank + n_rot]: written from rank on
  int8_t* q8 = nullptr;          // or null: q_nope's Q8_0 blocks, q8_0_act's layout over
  float* d8 = nullptr;           //   n_tok * n_head rows of nope (nope % 32 == 0)
  float* mirror = nullptr;       // [capacity][rank + n_rot]
  float* stage = nullptr;        // [n_tok][rank + n_rot]
  const int32_t* pos = nullptr;  // device int: token t is at position *pos + t
  int64_t n_tok = 0, n_head = 0, head_dim = 0, n_rot = 0, rank = 0;
  RopeFreq freq;                 // rope_freq of the layer's rotation
  bool neox = false;
  cudaStream_t stream = nullptr;
};
void launch_mla_prep(const MlaPrepParams& p);

}  // namespace frink::cuda
