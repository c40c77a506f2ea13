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
// (token, 8 heads) one block over all its keys and write the output directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

// Widths the kernel holds in registers: a lane keeps W / 32 query floats and rank / 32
// accumulators (DeepSeek-V2/V3 and Kimi-K2: 576 and 512).
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
  cudaStream_t stream = nullptr;
};

bool mla_attention_supported(int64_t width, int64_t rank);
size_t mla_scratch_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t rank);
void launch_mla_attention(const MlaAttnParams& p);

}  // namespace frink::cuda
