// Rotary position embedding on the device (host body: cpu::rope): pairs (kNorm) or neox
// halves, partial rotary (n_rot < head_dim), frequency factors, YaRN.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/norm.cuh"

namespace frink::cuda {

struct RopeLaunch {
  float* x = nullptr;         // [n_tok][row_stride], heads of head_dim from the row start
  int64_t row_stride = 0;
  int64_t n_tok = 0, n_head = 0, head_dim = 0;
  float* x2 = nullptr;        // optional second tensor, same positions (K beside Q: one launch)
  int64_t row_stride2 = 0, n_head2 = 0;
  const int32_t* pos = nullptr;  // device int: token t is at position *pos + t (device
                                 // memory, so a captured graph replays at any position)
  int64_t n_rot = 0;
  bool neox = false;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  float ext_factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;
  bool yarn_truncate = true;  // YaRN ramp ends floored/ceiled (ggml); false keeps them fractional
  const float* freq_factors = nullptr;  // [n_rot/2] divisors, or null
  // Optional (mirror_k set): the layer's new K/V rows appended in the same launch, as
  // launch_kv_append would after it (one kernel fewer per layer; at decode each of these
  // small kernels costs 2-4 us of a ~90 us layer). x2 is then K: n_head2 heads of head_dim
  // per row, stored as rows of n_head2 * head_dim. Row t of K (rotated) and of v lands at
  // mirror row *pos + t and at staging row t.
  const float* v = nullptr;
  int64_t v_width = 0;
  float* mirror_k = nullptr;
  float* mirror_v = nullptr;
  float* stage_k = nullptr;
  float* stage_v = nullptr;
  // Optional QK-norm first (Qwen3 and the like): norm_x over x's heads and norm_x2 over x2's
  // (rows of head_dim, y == x), in the rotation's launch when launch_rope can (else the pair of
  // norms is launched first: the same results).
  bool qk_norm = false;
  NormParams norm_x, norm_x2;
  cudaStream_t stream = nullptr;
};

void launch_rope(const RopeLaunch& p);
// Whether the QK-norms of p run inside the rotation (launch_rope's one-kernel form, and the
// q/k/v products' fused store): the vector norm body over rows that are exactly p's heads
// (y == x, not a layer norm), both at head_dim.
bool rope_norm_fuses(const RopeLaunch& p);

// What a pair's angle needs besides its position (rope_math.cuh reads only this), derived on
// the host once per launch from a RopeLaunch by rope_freq: launch_rope and the q/k/v
// products' fused rotation (MatmulParams::rope) take the same values.
struct RopeFreq {
  float theta_scale = 1.0f;  // freq_base^(-2 / n_rot)
  float freq_scale = 1.0f, ext_factor = 0.0f, attn_factor = 1.0f;
  float corr0 = 0.0f, corr1 = 0.0f;     // YaRN ramp ends (ext_factor != 0)
  const float* freq_factors = nullptr;  // [n_rot/2] divisors, or null
};
RopeFreq rope_freq(const RopeLaunch& p);

}  // namespace frink::cuda
