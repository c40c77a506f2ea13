// One thread per rotated pair; the pair's angle and rotation are rope_math.cuh's (shared with
// the q/k/v products' fused rotation, MatmulParams::rope).
#include "cuda/rope.cuh"

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/elementwise.cuh"
#include "cuda/norm_row.cuh"
#include "cuda/rope_math.cuh"

namespace frink::cuda {

namespace {

// Element c of token t's appended row (K's row, then V's) that the rotation does not write:
// K's dims n_rot.. of each head, and all of V.
__device__ void append_unrotated(const RopeLaunch& p, int64_t t, int64_t c) {
  const int64_t k_w = p.n_head2 * p.head_dim, row0 = *p.pos;
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

// Pair `pair` of head hh (x's heads, then x2's) of token t: rotated in place by cs (its
// rope_cos_sin), and K's also appended (mirror_k set).
__device__ __forceinline__ void rotate_pair(const RopeLaunch& p, int64_t t, int64_t hh, int64_t pair, float2 cs) {
  const bool second = hh >= p.n_head;  // heads of x2 follow those of x
  const int64_t h = second ? hh - p.n_head : hh;
  float* v = second ? p.x2 + t * p.row_stride2 + h * p.head_dim : p.x + t * p.row_stride + h * p.head_dim;
  const int64_t a = p.neox ? pair : 2 * pair, b = p.neox ? pair + p.n_rot / 2 : 2 * pair + 1;
  const float2 y = rope_rotate(v[a], v[b], cs);
  v[a] = y.x;
  v[b] = y.y;
  if (second && p.mirror_k) {
    const int64_t k_w = p.n_head2 * p.head_dim, col = h * p.head_dim, row = (*p.pos + t) * k_w;
    p.mirror_k[row + col + a] = y.x;
    p.mirror_k[row + col + b] = y.y;
    p.stage_k[t * k_w + col + a] = y.x;
    p.stage_k[t * k_w + col + b] = y.y;
  }
}

// A thread's pair angle serves this many heads: rope_cos_sin is a serial chain of up to
// n_rot / 2 multiplies and a cosf and sinf, where a rotation is two loads and two stores.
constexpr int kRopeHeads = 8;

// The items of a token: (pair, group of kRopeHeads heads) with the pair fastest, so a warp's
// loads are consecutive pairs of one head (the first `rotating`); then its append's elements
// (append_unrotated).
struct RopeItems {
  int64_t rotating, all;
};
__host__ __device__ inline RopeItems rope_items(const RopeLaunch& p) {
  const int64_t rotating = (p.n_head + p.n_head2 + kRopeHeads - 1) / kRopeHeads * (p.n_rot / 2);
  return {rotating, rotating + (p.mirror_k ? p.n_head2 * p.head_dim + p.v_width : 0)};
}

// Over row_grid(rope_items(p).all, n_tok). 32-bit indices within a token.
__global__ void rope_kernel(RopeLaunch p, RopeFreq f) {
  const int n_pairs = p.n_rot / 2, heads = p.n_head + p.n_head2;
  const RopeItems ri = rope_items(p);
  const int n_rotating = static_cast<int>(ri.rotating), items = static_cast<int>(ri.all);
  for (int64_t t = blockIdx.y; t < p.n_tok; t += gridDim.y)
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < items; i += gridDim.x * blockDim.x) {
      if (i >= n_rotating) {
        append_unrotated(p, t, i - n_rotating);
        continue;
      }
      const int pair = i % n_pairs, h0 = i / n_pairs * kRopeHeads;
      const float2 cs = rope_cos_sin(f, *p.pos + t, pair);
      for (int hh = h0; hh < min(h0 + kRopeHeads, heads); ++hh) rotate_pair(p, t, hh, pair, cs);
    }
}

// QK-norm with the rotation (RopeLaunch::qk_norm): one block per (token, head) row normed by
// norm.cu's body (norm_vec_row, so the same bits as launch_norm_pair), then its pairs rotated
// by the same threads after a barrier (which also makes the block's normed global writes
// visible to it). A K row's block also appends its unrotated dims (partial rotary): they are
// normed only once this block has run (appended by other blocks, they raced the norm: qwen3.5
// NMSE 0.23). Blocks past the rows append V. One launch where qwen3-style layers ran two
// (norm pair 2.7 us + RoPE 3.4 us of a 76 us qwen3-30b-a3b layer).
__global__ void __launch_bounds__(kNormMaxThreads) rope_norm_kernel(RopeLaunch p, RopeFreq f) {
  const int64_t heads = p.n_head + p.n_head2, rows = p.n_tok * heads;
  if (blockIdx.x >= rows) {
    const int64_t j = (blockIdx.x - rows) * int64_t{blockDim.x} + threadIdx.x;  // V element j of the batch
    const int64_t k_w = p.n_head2 * p.head_dim;
    if (p.mirror_k && j < p.n_tok * p.v_width) append_unrotated(p, j / p.v_width, k_w + j % p.v_width);
    return;
  }
  const int64_t t = blockIdx.x / heads, hh = blockIdx.x % heads;
  float4 o[kNormVecPer];
  if (hh < p.n_head) norm_vec_row(p.norm_x, o, t * p.n_head + hh);  // block-uniform branch
  else norm_vec_row(p.norm_x2, o, t * p.n_head2 + hh - p.n_head);
  __syncthreads();
  for (int64_t pair = threadIdx.x; pair < p.n_rot / 2; pair += blockDim.x)
    rotate_pair(p, t, hh, pair, rope_cos_sin(f, *p.pos + t, pair));
  if (hh >= p.n_head && p.mirror_k) {
    const int64_t col = (hh - p.n_head) * p.head_dim;
    for (int64_t c = p.n_rot + threadIdx.x; c < p.head_dim; c += blockDim.x)
      append_unrotated(p, t, col + c);
  }
}

float corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

}  // namespace

bool rope_norm_fuses(const RopeLaunch& p) {
  const auto fits = [&](const NormParams& n, float* x, int64_t stride, int64_t heads) {
    return norm_vec_ok(n) && n.n == p.head_dim && n.x == x && n.y == x && n.x_stride == p.head_dim &&
           n.y_stride == p.head_dim && n.n_rows == p.n_tok * heads && !n.layer_norm && stride == heads * p.head_dim;
  };
  return p.x2 && fits(p.norm_x, p.x, p.row_stride, p.n_head) && fits(p.norm_x2, p.x2, p.row_stride2, p.n_head2);
}

RopeFreq rope_freq(const RopeLaunch& p) {
  RopeFreq f;
  f.theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  f.freq_scale = p.freq_scale;
  f.ext_factor = p.ext_factor;
  f.attn_factor = p.attn_factor;
  f.freq_factors = p.freq_factors;
  if (p.ext_factor != 0.0f) {
    f.corr0 = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base);
    f.corr1 = corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base);
    if (p.yarn_truncate) f.corr0 = std::floor(f.corr0), f.corr1 = std::ceil(f.corr1);  // as the host's rope
    f.corr0 = std::fmax(0.0f, f.corr0);
    f.corr1 = std::fmin(static_cast<float>(p.n_rot - 1), f.corr1);
  }
  return f;
}

void launch_rope(const RopeLaunch& p) {
  const int64_t items = rope_items(p).all, n = p.n_tok * items;
  if (p.qk_norm && (n == 0 || !rope_norm_fuses(p))) {  // the same results in two launches
    launch_norm_pair(p.norm_x, p.norm_x2);
    RopeLaunch r = p;
    r.qk_norm = false;
    launch_rope(r);
    return;
  }
  if (n == 0) return;
  const RopeFreq f = rope_freq(p);
  if (p.qk_norm) {
    const int64_t threads = norm_vec_threads(p.head_dim), rows = p.n_tok * (p.n_head + p.n_head2);
    const int64_t v_blocks = p.mirror_k ? (p.n_tok * p.v_width + threads - 1) / threads : 0;
    rope_norm_kernel<<<static_cast<unsigned>(rows + v_blocks), static_cast<unsigned>(threads), 0,
                       p.stream>>>(p, f);
  } else {
    rope_kernel<<<row_grid(items, p.n_tok), 256, 0, p.stream>>>(p, f);
  }
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
