// Gated DeltaNet steps on the device (see delta_net.cuh).
//
// v1: correctness first. The recurrence runs token after token inside one launch per segment
// (the state stays in registers across the segment's tokens, the next token's inputs are
// fetched while the current one computes).
// v2 (this file): batches of kDeltaChunkMinTokens or more take the chunked (WY/UT) kernel, whose
// work per chunk is small matrix products in shared memory (f32 CUDA cores, no tensor cores:
// the result must match the recurrence to f32 rounding). Written and tested for correctness
// without a GPU at hand; neither kernel is timed yet, so the threshold is one full chunk.
#include "cuda/delta_net.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/occupancy.h"
#include "cuda/pdl.cuh"

namespace frink::cuda {

namespace {

constexpr int kRows = 16;  // rows of the state per thread in the recurrence

unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>(std::min<int64_t>((n + per_block - 1) / per_block, 1 << 20));
}

// Token t's gates of value head hv (index i = t * n_v_head + hv).
__device__ __forceinline__ void gate_one(const DeltaGatesParams& p, int64_t i) {
  const int64_t t = i / p.n_v_head, hv = i % p.n_v_head;
  const float* row = p.ba + t * 2 * p.n_v_head;
  float b, a;
  if (p.fused) {
    const int64_t rf = p.n_v_head / p.n_k_head, kh = hv / rf, r = hv % rf;
    b = row[kh * 2 * rf + r];
    a = row[kh * 2 * rf + rf + r];
  } else {
    b = row[hv];
    a = row[p.n_v_head + hv];
  }
  p.beta[i] = 1.0f / (1.0f + expf(-b));
  // ggml's softplus: log(1 + e^x), and x itself above 20 where the two agree in f32
  const float x = a + p.dt_bias[hv];
  p.g[i] = (x > 20.0f ? x : log1pf(expf(x))) * p.a[hv];
}

__global__ void gates_kernel(DeltaGatesParams p) {
  const int64_t n = p.n_tok * p.n_v_head;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    gate_one(p, i);
}

// Input u of the convolution: u >= 0 a new row, u < 0 the state's row width - 1 + u.
__device__ __forceinline__ float conv_input(const ConvParams& p, int64_t u, int64_t c) {
  return u >= 0 ? p.x[u * p.x_stride + c] : p.state[(p.width - 1 + u) * p.channels + c];
}

// silu(conv) of token t, channel c (the state only read).
__device__ __forceinline__ float conv_one(const ConvParams& p, int64_t t, int64_t c) {
  const int64_t K = p.width;
  float s = 0.0f;
  for (int64_t j = 0; j < K; ++j) s += conv_input(p, t + j - (K - 1), c) * p.w[c * K + j];
  if (p.bias) s += p.bias[c];
  return s / (1.0f + expf(-s));
}

// The state of channel c becomes inputs [n_tok - (width - 1), n_tok). Row r reads input
// n_tok - (width-1) + r, which (when negative) is old state row n_tok + r > r: rows are written
// in ascending order by the channel's one thread, so every old row is read before it is
// overwritten (in place; state_out is another buffer).
__device__ __forceinline__ void conv_state_one(const ConvParams& p, int64_t c) {
  const int64_t k1 = p.width - 1;
  float* out = p.state_out ? p.state_out : p.state;
  for (int64_t r = 0; r < k1; ++r) out[r * p.channels + c] = conv_input(p, p.n_tok - k1 + r, c);
}

__global__ void conv_kernel(ConvParams p) {
  const int64_t n = p.n_tok * p.channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.channels, c = i % p.channels;
    p.y[t * p.y_stride + c] = conv_one(p, t, c);
  }
}

__global__ void conv_state_kernel(ConvParams p) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= p.channels) return;
  conv_state_one(p, c);
}

// 1 / max(||x||, eps) of n floats, by one warp: each lane's squares in index order, then the
// xor tree (every lane gets it).
__device__ __forceinline__ float l2_scale(const float* x, int64_t n, float eps, int lane) {
  float ss = 0.0f;
  for (int64_t i = lane; i < n; i += 32) ss += x[i] * x[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return 1.0f / fmaxf(sqrtf(ss), eps);
}

__global__ void l2_norm_kernel(L2NormParams p) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;  // uniform per warp
  const int lane = threadIdx.x % 32;
  if (row >= p.n_tok * p.n_head) return;
  float* x = p.x + (row / p.n_head) * p.x_stride + (row % p.n_head) * p.n;
  const float scale = l2_scale(x, p.n, p.eps, lane);
  for (int64_t i = lane; i < p.n; i += 32) x[i] *= scale;
}

// One decode token's gates, convolution (with its state) and q/k l2 norm in one launch: block
// b is head b's l.n channels (q heads, k heads, then v heads: channels = heads x l.n), one a
// thread; the q/k heads' outputs meet in shared memory for the norm; block 0 also does the gates.
// The same functions as the three launches, in the same order: the same bits.
// A dependent launch (launch_dependent): its blocks wait for the input products here.
__global__ void decode_prep_kernel(ConvParams c, L2NormParams l, DeltaGatesParams g) {
  extern __shared__ float ys[];  // [l.n]
  grid_dependency_wait();
  const int64_t ch = int64_t{blockIdx.x} * l.n + threadIdx.x;
  const bool mine = threadIdx.x < l.n;
  float y = 0.0f;
  if (mine) {
    y = conv_one(c, 0, ch);
    conv_state_one(c, ch);
  }
  if (blockIdx.x < l.n_head) {  // block-uniform
    if (mine) ys[threadIdx.x] = y;
    __syncthreads();
    if (threadIdx.x < 32) {
      const float scale = l2_scale(ys, l.n, l.eps, static_cast<int>(threadIdx.x));
      if (threadIdx.x == 0) ys[l.n] = scale;
    }
    __syncthreads();
    y *= ys[l.n];
  }
  if (mine) c.y[ch] = y;
  if (blockIdx.x == 0)
    for (int64_t i = threadIdx.x; i < g.n_v_head; i += blockDim.x) gate_one(g, i);
}

// Block (32, W): lane = column j within the block's 32, warp w = rows [16 w, 16 w + 16) of the
// state. Shared: q and k of the token (padded with zeros to 16 W rows, so rows past d add
// nothing and need no test), and the per-warp partial sums of S^T k and S^T q.
__global__ void __launch_bounds__(512) delta_rule_kernel(DeltaRuleParams p) {
  extern __shared__ float sh[];
  const int lane = static_cast<int>(threadIdx.x), w = static_cast<int>(threadIdx.y), W = static_cast<int>(blockDim.y);
  const int tid = w * 32 + lane, n_threads = W * 32;
  const int64_t d = p.d, hv = blockIdx.x, nv = p.n_v_head, nk = p.n_k_head;
  const int64_t j = int64_t{blockIdx.y} * 32 + lane;
  const bool col = j < d;
  const int64_t hk = p.kv_head_tiled ? hv % nk : hv / (nv / nk);
  const int64_t padded = int64_t{W} * kRows;
  float* q_s = sh;
  float* k_s = sh + padded;
  float* red_k = k_s + padded;  // [W][32]: partial S^T k
  float* red_q = red_k + n_threads;  // [W][32]: partial S^T q
  for (int64_t i = d + tid; i < padded; i += n_threads) q_s[i] = k_s[i] = 0.0f;
  float* S = p.state + hv * d * d;
  const int64_t i0 = int64_t{w} * kRows;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = col && i0 + r < d ? S[(i0 + r) * d + j] : 0.0f;
  // The state is no output of the kernels before (this kernel wrote it last, a token or a
  // segment ago, and those launches waited for it): its tile's loads may overlap the prep
  // kernel's (launch_dependent); q, k, v and the gates are read only after this. With the prep
  // kernel dependent too: qwen3-next-80b-a3b Q4_K_M, 4 layers, tg128 graph 0.295 / 0.293 / 0.294
  // -> 0.291 / 0.291 / 0.293 ms (H200, one call, alternating), logits bit for bit.
  grid_dependency_wait();

  // Token t's inputs are loaded into registers while token t - 1 computes, so a prefill does
  // not wait a global-memory latency per token. 32 * ceil(d / 16) threads >= d: each thread
  // holds at most one element of q and of k.
  const bool loads = tid < d;
  float nq = 0.0f, nkk = 0.0f, nv_ = 0.0f, ng = 0.0f, nb = 0.0f;
  const auto fetch = [&](int64_t t) {
    const float* row = p.qkv + t * p.qkv_stride;
    if (loads) {
      nq = row[hk * d + tid];
      nkk = row[(nk + hk) * d + tid];
    }
    nv_ = col ? row[2 * nk * d + hv * d + j] : 0.0f;
    ng = p.g[t * nv + hv];
    nb = p.beta[t * nv + hv];
  };
  fetch(0);
  for (int64_t t = 0; t < p.n_tok; ++t) {
    if (loads) {
      q_s[tid] = nq * p.q_scale;
      k_s[tid] = nkk;
    }
    const float decay = expf(ng), beta = nb, v = nv_;
    if (t + 1 < p.n_tok) fetch(t + 1);
    __syncthreads();  // q_s, k_s written
    // S *= exp(g); sk = S^T k
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] *= decay;
      part += k_s[i0 + r] * s[r];
    }
    red_k[tid] = part;
    __syncthreads();  // red_k complete
    float sk = 0.0f;
    for (int ww = 0; ww < W; ++ww) sk += red_k[ww * 32 + lane];
    // delta = beta (v - sk); S += k delta^T; o = S^T q
    const float delta = beta * (v - sk);
    float part_o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] += k_s[i0 + r] * delta;
      part_o += q_s[i0 + r] * s[r];
    }
    red_q[tid] = part_o;
    // red_q complete, and every thread is done with this token's q_s, k_s and red_k: the next
    // token may overwrite them. Warp 0 reads red_q before it reaches the next token's second
    // barrier, the first point where red_q is written again.
    __syncthreads();
    if (w == 0 && col) {
      float o = 0.0f;
      for (int ww = 0; ww < W; ++ww) o += red_q[ww * 32 + lane];
      p.out[t * p.out_stride + hv * d + j] = o;
    }
  }
  float* const S_out = p.state_out ? p.state_out + hv * d * d : S;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (col && i0 + r < d) S_out[(i0 + r) * d + j] = s[r];
}

// ---- the chunked (WY/UT) form, for prefill ------------------------------------------------
//
// Per chunk of n <= L tokens, with G_r the chunk-local cumulative log decay (so every factor
// below is exp of a difference <= 0: nothing overflows, and exp(G) underflowing to 0 under
// strong decays is the true value to f32), cpu::delta_rule_chunked's
//   A  = strictly lower (beta_r (k_r . k_s) exp(G_r - G_s)),  QK = lower (q_r . k_s) exp(G_r - G_s)
//   V' = U - W S = (I + A)^-1 X,  X = beta (V - exp(G) (K S))    (U, W as the host's)
//   O  = exp(G) (Q S) + QK V'
//   S <- exp(G_last) S + (K exp(G_last - G))^T V'
// Writing V' as one triangular solve on X (L x 32) instead of forming W (L x d) means a block
// needs nothing from the other column tiles of its head: A and QK, the only column-independent
// products, are recomputed by each of the d / 32 tiles. That costs about 1.4x the work of
// computing them once per head into scratch (d 128: 5.8 M vs 4.1 M multiply-adds per head and
// chunk; 1.8x at d 256), and keeps DeltaRuleParams free of a scratch buffer.
//
// Block (head hv, 32 columns), 256 threads; shared memory holds the chunk's K^T and Q^T
// (rows padded with zeros to dp = d rounded up to 32, and token columns past n zero, so no
// loop tests either), the S tile [dp][32], A, QK^T and V'. Rows past n have beta 0 and zero
// k, q: they add nothing anywhere and their outputs are not written.
constexpr int kChunk = 64;            // L, llama.cpp's chunk
constexpr int kChunkThreads = 256;    // 8 warps; the 4 x 4 tiles of A cover L x L exactly
constexpr int kChunkCols = 32;        // columns of S per block
constexpr int kLdT = kChunk + 4;      // K^T, Q^T, QK^T rows: float4-aligned, rows 4 banks apart
constexpr int kLdV = kChunkCols + 4;  // V' rows: the solve's 8 rows x 4 columns hit 32 banks
static_assert(kChunk * kChunk == 16 * kChunkThreads, "one 4 x 4 tile of A per thread");
static_assert(kChunkThreads / 32 * 8 == kChunk && kChunkThreads / 32 * 4 == kChunkCols, "8 rows, 4 solved columns per warp");

__host__ __device__ inline int64_t chunk_dp(int64_t d) { return (d + 31) / 32 * 32; }

// G (doubles) first for their alignment; every array is a multiple of 4 floats (float4 loads).
size_t chunk_smem_bytes(int64_t d) {
  const int64_t dp = chunk_dp(d);
  return static_cast<size_t>(5 * kChunk + 2 * dp * kLdT + dp * kChunkCols + kChunk * kChunk + kChunk * kLdT +
                             kChunk * kLdV) *
         sizeof(float);
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__global__ void __launch_bounds__(kChunkThreads) delta_chunk_kernel(DeltaRuleParams p) {
  extern __shared__ float4 sh4[];
  constexpr int L = kChunk, T = kChunkThreads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int d = static_cast<int>(p.d), dp = static_cast<int>(chunk_dp(p.d));
  const int64_t hv = blockIdx.x, nv = p.n_v_head, nk = p.n_k_head, col0 = int64_t{blockIdx.y} * kChunkCols;
  const int64_t hk = p.kv_head_tiled ? hv % nk : hv / (nv / nk);
  double* G = reinterpret_cast<double*>(sh4);               // [L] cumulative log decay
  float* beta = reinterpret_cast<float*>(sh4) + 2 * L;      // [L], 0 past n
  float* eG = beta + L;                                     // [L] exp(G_r)
  float* eLR = eG + L;                                      // [L] exp(G_last - G_r)
  float* Kt = eLR + L;                                      // [dp][kLdT] k_r[i] at i * kLdT + r
  float* Qt = Kt + dp * kLdT;                               // [dp][kLdT] q_r[i] q_scale
  float* Ss = Qt + dp * kLdT;                               // [dp][32] the S tile
  float* A = Ss + dp * kChunkCols;                          // [L][L]
  float* QKt = A + L * L;                                   // [L][kLdT] QK[r][c] at c * kLdT + r
  float* Vp = QKt + L * kLdT;                               // [L][kLdV] X, then V' in place

  for (int e = tid; e < (dp - d) * kLdT; e += T) Kt[d * kLdT + e] = Qt[d * kLdT + e] = 0.0f;
  float* S = p.state + hv * p.d * p.d;
  for (int e = tid; e < dp * kChunkCols; e += T) {
    const int64_t i = e / kChunkCols, j = col0 + e % kChunkCols;
    Ss[e] = i < d && j < d ? S[i * d + j] : 0.0f;
  }
  const float* v_col = p.qkv + 2 * nk * d + hv * d + col0 + lane;  // this lane's column of v
  const bool col_in = col0 + lane < d;

  for (int64_t c0 = 0; c0 < p.n_tok; c0 += L) {
    const int n = p.n_tok - c0 < L ? static_cast<int>(p.n_tok - c0) : L;
    for (int e = tid; e < L * d; e += T) {
      const int r = e / d, i = e % d;
      const float* row = p.qkv + (c0 + r) * p.qkv_stride;
      Kt[i * kLdT + r] = r < n ? row[(nk + hk) * d + i] : 0.0f;
      Qt[i * kLdT + r] = r < n ? row[hk * d + i] * p.q_scale : 0.0f;
    }
    if (warp == 0) {  // G by an inclusive scan over two halves of 32, in double as the host's
      double g_lo = lane < n ? p.g[(c0 + lane) * nv + hv] : 0.0;
      double g_hi = lane + 32 < n ? p.g[(c0 + lane + 32) * nv + hv] : 0.0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double lo = __shfl_up_sync(0xffffffffu, g_lo, o), hi = __shfl_up_sync(0xffffffffu, g_hi, o);
        if (lane >= o) g_lo += lo, g_hi += hi;
      }
      g_hi += __shfl_sync(0xffffffffu, g_lo, 31);
      const double last = __shfl_sync(0xffffffffu, g_hi, 31);  // = G[n - 1]: g is 0 past n
      G[lane] = g_lo;
      G[lane + 32] = g_hi;
      eG[lane] = expf(static_cast<float>(g_lo));
      eG[lane + 32] = expf(static_cast<float>(g_hi));
      eLR[lane] = expf(static_cast<float>(last - g_lo));
      eLR[lane + 32] = expf(static_cast<float>(last - g_hi));
      beta[lane] = lane < n ? p.beta[(c0 + lane) * nv + hv] : 0.0f;
      beta[lane + 32] = lane + 32 < n ? p.beta[(c0 + lane + 32) * nv + hv] : 0.0f;
    }
    __syncthreads();

    // A and QK^T, a 4 x 4 tile of (r, c) per thread; tiles above the diagonal are zeros.
    {
      const int r0 = tid / 16 * 4, cb = tid % 16 * 4;
      float kk[4][4] = {}, qk[4][4] = {};
      if (cb <= r0) {
#pragma unroll 2
        for (int i = 0; i < dp; ++i) {
          const float4 kr4 = ld4(Kt + i * kLdT + r0), qr4 = ld4(Qt + i * kLdT + r0), kc4 = ld4(Kt + i * kLdT + cb);
          const float kr[4] = {kr4.x, kr4.y, kr4.z, kr4.w}, qr[4] = {qr4.x, qr4.y, qr4.z, qr4.w};
          const float kc[4] = {kc4.x, kc4.y, kc4.z, kc4.w};
#pragma unroll
          for (int x = 0; x < 4; ++x)
#pragma unroll
            for (int y = 0; y < 4; ++y) {
              kk[x][y] += kr[x] * kc[y];
              qk[x][y] += qr[x] * kc[y];
            }
        }
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          const int r = r0 + x, c = cb + y;
          const float decay = c <= r ? expf(static_cast<float>(G[r] - G[c])) : 0.0f;
          A[r * L + c] = c < r ? beta[r] * kk[x][y] * decay : 0.0f;
          QKt[c * kLdT + r] = qk[x][y] * decay;
        }
    }
    // K S and Q S for rows [8 warp, 8 warp + 8), column lane: X into Vp, exp(G) Q S kept in o.
    const int r0 = warp * 8;
    float o[8];
    {
      float ks[8] = {}, qs[8] = {};
#pragma unroll 2
      for (int i = 0; i < dp; ++i) {
        const float s = Ss[i * kChunkCols + lane];
        const float4 k0 = ld4(Kt + i * kLdT + r0), k1 = ld4(Kt + i * kLdT + r0 + 4);
        const float4 q0 = ld4(Qt + i * kLdT + r0), q1 = ld4(Qt + i * kLdT + r0 + 4);
        const float k[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
        const float q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int x = 0; x < 8; ++x) {
          ks[x] += k[x] * s;
          qs[x] += q[x] * s;
        }
      }
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const int r = r0 + x;
        const float v = r < n && col_in ? v_col[(c0 + r) * p.qkv_stride] : 0.0f;
        Vp[r * kLdV + lane] = beta[r] * (v - eG[r] * ks[x]);
        o[x] = eG[r] * qs[x];
      }
    }
    __syncthreads();  // A, QK^T, X complete

    // V' = (I + A)^-1 X by forward substitution: warp w solves columns [4 w, 4 w + 4), 8 lanes
    // per column splitting the sum over earlier rows.
    {
      const int c = warp * 4 + lane / 8, part = lane % 8;
      for (int r = 1; r < n; ++r) {
        float sum = 0.0f;
        for (int s = part; s < r; s += 8) sum += A[r * L + s] * Vp[s * kLdV + c];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        if (part == 0) Vp[r * kLdV + c] -= sum;
        __syncwarp();  // row r visible to the warp's next row
      }
    }
    __syncthreads();  // V' complete

    // O = exp(G) Q S + QK V' (QK^T is zero past the diagonal and past n).
    {
#pragma unroll 2
      for (int c = 0; c < r0 + 8; ++c) {
        const float v = Vp[c * kLdV + lane];
        const float4 a0 = ld4(QKt + c * kLdT + r0), a1 = ld4(QKt + c * kLdT + r0 + 4);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
        for (int x = 0; x < 8; ++x) o[x] += a[x] * v;
      }
#pragma unroll
      for (int x = 0; x < 8; ++x)
        if (r0 + x < n && col_in) p.out[(c0 + r0 + x) * p.out_stride + hv * d + col0 + lane] = o[x];
    }
    // S = exp(G_last) S + (K exp(G_last - G))^T V': rows [8 warp, +8) of every 64, column lane.
    // Only Vp, Kt and eLR are read, and Ss was last read before the barrier above.
    {
      const float e_last = eG[n - 1];
      for (int i0 = warp * 8; i0 < dp; i0 += 64) {
        float acc[8] = {};
        for (int r = 0; r < n; r += 4) {  // rows [n, n rounded up to 4) are zero
          float v[4];
#pragma unroll
          for (int y = 0; y < 4; ++y) v[y] = Vp[(r + y) * kLdV + lane] * eLR[r + y];
#pragma unroll
          for (int x = 0; x < 8; ++x) {
            const float4 k = ld4(Kt + (i0 + x) * kLdT + r);
            acc[x] += k.x * v[0] + k.y * v[1] + k.z * v[2] + k.w * v[3];
          }
        }
#pragma unroll
        for (int x = 0; x < 8; ++x) {
          float& s = Ss[(i0 + x) * kChunkCols + lane];
          s = e_last * s + acc[x];
        }
      }
    }
    __syncthreads();  // before the next chunk overwrites the inputs and reads Ss
  }
  float* const S_out = p.state_out ? p.state_out + hv * p.d * p.d : S;
  for (int e = tid; e < dp * kChunkCols; e += T) {
    const int64_t i = e / kChunkCols, j = col0 + e % kChunkCols;
    if (i < d && j < d) S_out[i * d + j] = Ss[e];
  }
}

}  // namespace

bool delta_net_supported(int64_t head_dim, int64_t conv_width) {
  return head_dim >= 1 && head_dim <= kDeltaMaxHeadDim && conv_width >= 1 && conv_width <= kConvMaxWidth;
}

void launch_delta_gates(const DeltaGatesParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.n_k_head > 0 && p.n_v_head % p.n_k_head == 0 ? cudaSuccess : cudaErrorInvalidValue);
  gates_kernel<<<blocks_for(p.n_tok * p.n_v_head, 256), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_conv1d_silu(const ConvParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.width >= 1 && p.width <= kConvMaxWidth && p.x_stride >= p.channels && p.y_stride >= p.channels
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  conv_kernel<<<blocks_for(p.n_tok * p.channels, 256), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
  if (p.width > 1) {
    conv_state_kernel<<<static_cast<unsigned>((p.channels + 255) / 256), 256, 0, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
  }
}

void launch_l2_norm(const L2NormParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(p.n > 0 ? cudaSuccess : cudaErrorInvalidValue);
  const int64_t rows = p.n_tok * p.n_head;  // 8 warps (rows) per block
  l2_norm_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

bool delta_decode_prep_ok(const ConvParams& c, const L2NormParams& l, const DeltaGatesParams& g) {
  return c.n_tok == 1 && l.n_tok == 1 && g.n_tok == 1 && l.x == c.y && l.n >= 1 && l.n <= 1024 &&
         c.channels % l.n == 0 && l.n_head * l.n <= c.channels && c.width >= 1 && c.width <= kConvMaxWidth &&
         g.n_k_head > 0 && g.n_v_head % g.n_k_head == 0 && c.stream == l.stream && c.stream == g.stream;
}

void launch_delta_decode_prep(const ConvParams& c, const L2NormParams& l, const DeltaGatesParams& g) {
  FRINK_CUDA_CHECK(delta_decode_prep_ok(c, l, g) ? cudaSuccess : cudaErrorInvalidValue);
  const auto threads = static_cast<unsigned>((l.n + 31) / 32 * 32);
  launch_dependent(decode_prep_kernel, dim3(static_cast<unsigned>(c.channels / l.n)), dim3(threads),
                   static_cast<size_t>(l.n + 1) * sizeof(float), c.stream, c, l, g);
  FRINK_CUDA_CHECK_LAUNCH();
}

bool delta_rule_uses_chunks(const DeltaRuleParams& p) {
  if (p.n_tok < p.chunk_min_tokens) return false;
  int dev = 0, optin = 0;
  FRINK_CUDA_CHECK(cudaGetDevice(&dev));
  FRINK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return chunk_smem_bytes(p.d) <= static_cast<size_t>(optin);
}

void launch_delta_rule(const DeltaRuleParams& p) {
  if (p.n_tok == 0) return;
  FRINK_CUDA_CHECK(delta_net_supported(p.d, 1) && p.n_k_head > 0 && p.n_v_head % p.n_k_head == 0
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(p.n_v_head), static_cast<unsigned>((p.d + 31) / 32));
  if (delta_rule_uses_chunks(p)) {
    const size_t smem = chunk_smem_bytes(p.d);
    opt_in_smem(reinterpret_cast<const void*>(delta_chunk_kernel), smem);
    delta_chunk_kernel<<<grid, kChunkThreads, smem, p.stream>>>(p);
  } else {
    const int W = static_cast<int>((p.d + kRows - 1) / kRows);  // 1..16 warps
    const size_t smem = static_cast<size_t>(2 * W * kRows + 2 * W * 32) * sizeof(float);
    launch_dependent(delta_rule_kernel, grid, dim3(32, static_cast<unsigned>(W)), smem, p.stream, p);
  }
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
