// One thread per rotated pair. The angle is built exactly as the host (and ggml's
// rope_cache_init) builds it: theta = pos, multiplied by theta_scale once per earlier pair
// in float, so device and host angles round identically (a direct pow() differs by enough
// ulps to move sin/cos at positions in the thousands).
#include "cuda/rope.cuh"

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/norm_row.cuh"

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

// Pair `pair` of head hh (x's heads, then x2's) of token t: rotated in place, and K's also
// appended (mirror_k set).
__device__ __forceinline__ void rotate_pair(const RopeLaunch& p, int64_t t, int64_t hh, int64_t pair, float theta_scale,
                                            float corr0, float corr1) {
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

__global__ void rope_kernel(RopeLaunch p, float theta_scale, float corr0, float corr1) {
  const int64_t n_pairs = p.n_rot / 2, heads = p.n_head + p.n_head2;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= p.n_tok * heads * n_pairs) {
    if (p.mirror_k) append_unrotated(p, i - p.n_tok * heads * n_pairs);
    return;
  }
  rotate_pair(p, i / (n_pairs * heads), (i / n_pairs) % heads, i % n_pairs, theta_scale, corr0, corr1);
}

// QK-norm with the rotation (RopeLaunch::qk_norm): one block per (token, head) row normed by
// norm.cu's body (norm_vec_row, so the same bits as launch_norm_pair), then its pairs rotated
// by the same threads after a barrier (which also makes the block's normed global writes
// visible to it). A K row's block also appends its unrotated dims (partial rotary): they are
// normed only once this block has run (appended by other blocks, they raced the norm: qwen3.5
// NMSE 0.23). Blocks past the rows append V. One launch where qwen3-style layers ran two
// (norm pair 2.7 us + RoPE 3.4 us of a 76 us qwen3-30b-a3b layer).
__global__ void __launch_bounds__(kNormMaxThreads) rope_norm_kernel(RopeLaunch p, float theta_scale, float corr0,
                                                                     float corr1) {
  const int64_t heads = p.n_head + p.n_head2, rows = p.n_tok * heads;
  if (blockIdx.x >= rows) {
    const int64_t j = (blockIdx.x - rows) * int64_t{blockDim.x} + threadIdx.x;  // V element j of the batch
    const int64_t k_w = p.n_head2 * p.head_dim;
    if (p.mirror_k && j < p.n_tok * p.v_width) append_unrotated(p, j / p.v_width * (k_w + p.v_width) + k_w + j % p.v_width);
    return;
  }
  const int64_t t = blockIdx.x / heads, hh = blockIdx.x % heads;
  float4 o[kNormVecPer];
  if (hh < p.n_head) norm_vec_row(p.norm_x, o, t * p.n_head + hh);  // block-uniform branch
  else norm_vec_row(p.norm_x2, o, t * p.n_head2 + hh - p.n_head);
  __syncthreads();
  for (int64_t pair = threadIdx.x; pair < p.n_rot / 2; pair += blockDim.x)
    rotate_pair(p, t, hh, pair, theta_scale, corr0, corr1);
  if (hh >= p.n_head && p.mirror_k) {
    const int64_t k_w = p.n_head2 * p.head_dim, col = (hh - p.n_head) * p.head_dim;
    for (int64_t c = p.n_rot + threadIdx.x; c < p.head_dim; c += blockDim.x)
      append_unrotated(p, t * (k_w + p.v_width) + col + c);
  }
}

float corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

}  // namespace

// Whether the QK-norms of p can run inside the rotation kernel: the vector norm body over rows
// that are exactly p's heads (y == x), both at head_dim.
static bool norm_fuses(const RopeLaunch& p) {
  const auto fits = [&](const NormParams& n, float* x, int64_t stride, int64_t heads) {
    return norm_vec_ok(n) && n.n == p.head_dim && n.x == x && n.y == x && n.x_stride == p.head_dim &&
           n.y_stride == p.head_dim && n.n_rows == p.n_tok * heads && !n.layer_norm && stride == heads * p.head_dim;
  };
  return p.x2 && fits(p.norm_x, p.x, p.row_stride, p.n_head) && fits(p.norm_x2, p.x2, p.row_stride2, p.n_head2);
}

void launch_rope(const RopeLaunch& p) {
  const int64_t n_append = p.mirror_k ? p.n_tok * (p.n_head2 * p.head_dim + p.v_width) : 0;
  const int64_t n = p.n_tok * (p.n_head + p.n_head2) * (p.n_rot / 2) + n_append;
  if (p.qk_norm && (n == 0 || !norm_fuses(p))) {  // the same results in two launches
    launch_norm_pair(p.norm_x, p.norm_x2);
    RopeLaunch r = p;
    r.qk_norm = false;
    launch_rope(r);
    return;
  }
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
  if (p.qk_norm) {
    const int64_t threads = norm_vec_threads(p.head_dim), rows = p.n_tok * (p.n_head + p.n_head2);
    const int64_t v_blocks = p.mirror_k ? (p.n_tok * p.v_width + threads - 1) / threads : 0;
    rope_norm_kernel<<<static_cast<unsigned>(rows + v_blocks), static_cast<unsigned>(threads), 0,
                       p.stream>>>(p, theta_scale, corr0, corr1);
  } else {
    rope_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, p.stream>>>(p, theta_scale, corr0, corr1);
  }
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
