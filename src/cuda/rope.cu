// One thread per rotated pair. The angle is built exactly as the host (and ggml's
// rope_cache_init) builds it: theta = pos, multiplied by theta_scale once per earlier pair
// in float, so device and host angles round identically (a direct pow() differs by enough
// ulps to move sin/cos at positions in the thousands).
#include "cuda/rope.cuh"

#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

__device__ float yarn_ramp(float low, float high, int i0) {
  const float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// The append's share of the index space (after the pairs): K elements the rotation does not
// write (dims n_rot.. of each head), then V, row by row.
__device__ void append_unrotated(const RopeLaunch& p, int64_t j) {
  const int64_t k_w = p.n_head2 * p.head_dim, w = k_w + p.v_width, row0 = *p.pos;
  const int64_t t = j / w, c = j % w;
  if (t >= p.n_tok) return;
  if (c < k_w) {
    if (c % p.head_dim < p.n_rot) return;  // its pair's thread writes it, rotated
    const float x = p.x2[t * p.row_stride2 + c];
    p.mirror_k[(row0 + t) * k_w + c] = x;
    p.stage_k[t * k_w + c] = x;
  } else {
    const float x = p.v[t * p.v_width + (c - k_w)];
    p.mirror_v[(row0 + t) * p.v_width + (c - k_w)] = x;
    p.stage_v[t * p.v_width + (c - k_w)] = x;
  }
}

__global__ void rope_kernel(RopeLaunch p, float theta_scale, float corr0, float corr1) {
  const int64_t n_pairs = p.n_rot / 2, heads = p.n_head + p.n_head2;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= p.n_tok * heads * n_pairs) {
    if (p.mirror_k) append_unrotated(p, i - p.n_tok * heads * n_pairs);
    return;
  }
  const int64_t pair = i % n_pairs, hh = (i / n_pairs) % heads, t = i / (n_pairs * heads);
  const bool second = hh >= p.n_head;  // heads of x2 follow those of x
  const int64_t h = second ? hh - p.n_head : hh;
  const int i0 = static_cast<int>(2 * pair);
  float theta_base = static_cast<float>(*p.pos + t);
  for (int64_t k = 0; k < pair; ++k) theta_base *= theta_scale;
  const float ff = p.freq_factors ? p.freq_factors[pair] : 1.0f;
  const float theta_extrap = theta_base / ff;
  const float theta_interp = p.freq_scale * theta_extrap;
  float theta = theta_interp, mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    const float mix = yarn_ramp(corr0, corr1, i0) * p.ext_factor;
    theta = theta_interp * (1 - mix) + theta_extrap * mix;
    mscale *= 1.0f + 0.1f * logf(1.0f / p.freq_scale);
  }
  const float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
  float* v = second ? p.x2 + t * p.row_stride2 + h * p.head_dim : p.x + t * p.row_stride + h * p.head_dim;
  const int64_t a = p.neox ? pair : i0, b = p.neox ? pair + p.n_rot / 2 : i0 + 1;
  const float x0 = v[a], x1 = v[b];
  const float ya = x0 * c - x1 * s, yb = x0 * s + x1 * c;
  v[a] = ya;
  v[b] = yb;
  if (second && p.mirror_k) {
    const int64_t k_w = p.n_head2 * p.head_dim, col = h * p.head_dim, row = (*p.pos + t) * k_w;
    p.mirror_k[row + col + a] = ya;
    p.mirror_k[row + col + b] = yb;
    p.stage_k[t * k_w + col + a] = ya;
    p.stage_k[t * k_w + col + b] = yb;
  }
}

float corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

}  // namespace

void launch_rope(const RopeLaunch& p) {
  const int64_t n = p.n_tok * (p.n_head + p.n_head2) * (p.n_rot / 2) +
                    (p.mirror_k ? p.n_tok * (p.n_head2 * p.head_dim + p.v_width) : 0);
  if (n == 0) return;
  float corr0 = 0, corr1 = 0;
  if (p.ext_factor != 0.0f) {
    corr0 = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base);
    corr1 = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base);
    if (p.yarn_truncate) corr0 = std::floor(corr0), corr1 = std::ceil(corr1);  // as the host's rope
    corr0 = std::fmax(0.0f, corr0);
    corr1 = std::fmin(static_cast<float>(p.n_rot - 1), corr1);
  }
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  rope_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, p.stream>>>(p, theta_scale, corr0, corr1);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
