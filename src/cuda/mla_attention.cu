#include "cuda/mla_attention.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/attention.cuh"
#include "cuda/cuda_check.h"
#include "cuda/norm_row.cuh"
#include "cuda/occupancy.h"
#include "cuda/q8_0_rule.cuh"
#include "cuda/rope_math.cuh"

namespace frink::cuda {

namespace {

constexpr int kHeads = 8;     // warps a block, one query head each
constexpr int kTileRows = 8;  // cache rows a block stages in shared memory at a time
constexpr int kQPer = static_cast<int>(kMlaMaxWidth / 32), kVPer = static_cast<int>(kMlaMaxRank / 32);
constexpr int64_t kMinChunk = 64, kMaxSplits = 256;
constexpr int kMergeThreads = 256;

// Keys a decode split takes: 64, or more where the context would give over kMaxSplits splits
// (the partials grow with the splits, by n_head * (2 + rank) floats each).
int64_t mla_chunk(int64_t max_keys) {
  const int64_t per = (max_keys + kMaxSplits - 1) / kMaxSplits;
  return std::max(kMinChunk, (per + kMinChunk - 1) / kMinChunk * kMinChunk);
}

bool splits(int64_t n_tok) { return n_tok < kAttnPrefillMinTok; }

// Output element d0 + lane of row `row`, held by lane of a full warp, into its Q8_0 block
// (MlaAttnParams::out_q8; rank % 32 == 0, d0 % 32 == 0).
__device__ __forceinline__ void q8_store(const MlaAttnParams& p, int64_t row, int64_t d0, float v) {
  const Q8Elem e = q8_0_warp_block(v);
  p.out_q8[row * p.rank + d0 + threadIdx.x % 32] = e.q;
  if (threadIdx.x % 32 == 0) p.out_d8[row * (p.rank / 32) + d0 / 32] = e.d;
}

// Decode batches: grid (splits, heads / kHeads, n_tok). Each warp keeps its head's online
// softmax (max m, sum l, acc[rank] split over the lanes as d = lane + 32 i) over the split's
// keys, which the block stages kTileRows rows at a time (contiguous in the mirror: one flat
// copy), and writes (m, l, acc) to the partials for the merge.
__global__ void __launch_bounds__(kHeads * 32) mla_attn_kernel(MlaAttnParams p, int64_t chunk) {
  __shared__ float tile[kTileRows * kMlaMaxWidth];
  const int64_t t = blockIdx.z, h = blockIdx.y * int64_t{kHeads} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, W = static_cast<int>(p.width), R = static_cast<int>(p.rank);
  const int64_t n_keys = *p.pos + t + 1;  // causal: rows [0, pos0 + t]
  const int64_t begin = blockIdx.x * chunk, end = min(n_keys, begin + chunk);
  if (begin >= end) return;  // a split past this query's keys (the grid is sized by max_keys)
  const bool live = h < p.n_head;  // warp-uniform: a last block's spare warps only stage rows

  float q[kQPer];
  const float* qh = p.q + (t * p.n_head + (live ? h : 0)) * W;
#pragma unroll
  for (int i = 0; i < kQPer; ++i) q[i] = lane + 32 * i < W ? qh[lane + 32 * i] : 0.0f;
  float m = -INFINITY, l = 0.0f, acc[kVPer];
#pragma unroll
  for (int i = 0; i < kVPer; ++i) acc[i] = 0.0f;

  for (int64_t j0 = begin; j0 < end; j0 += kTileRows) {
    const int nr = static_cast<int>(min(int64_t{kTileRows}, end - j0));
    __syncthreads();  // the last tile's readers are done
    const float* src = p.rows + j0 * W;
    for (int e = threadIdx.x; e < nr * W; e += blockDim.x) tile[e] = src[e];
    __syncthreads();
    if (!live) continue;
    for (int r = 0; r < nr; ++r) {
      const float* row = tile + r * W;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kQPer; ++i)
        if (lane + 32 * i < W) s += q[i] * row[lane + 32 * i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= p.scale;
      const float m_new = fmaxf(m, s), corr = expf(m - m_new), e = expf(s - m_new);
      l = l * corr + e;
#pragma unroll
      for (int i = 0; i < kVPer; ++i)
        if (lane + 32 * i < R) acc[i] = acc[i] * corr + e * row[lane + 32 * i];
      m = m_new;
    }
  }
  if (!live) return;
  float* o = p.partial + ((t * p.n_head + h) * gridDim.x + blockIdx.x) * (2 + R);
  if (lane == 0) {
    o[0] = m;
    o[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kVPer; ++i)
    if (lane + 32 * i < R) o[2 + lane + 32 * i] = acc[i];
}

// Prompt batches: grid (heads / kHeads, n_tok), a warp a head, over all of the token's keys in
// tiles of 32 rows. Scoring is lane-per-key (lane j dots key j with the warp's query, read from
// shared memory as a broadcast), so a tile costs one softmax update and no shuffle chain a key;
// the values' accumulation splits the rank over the lanes with each key's weight broadcast by a
// shuffle. Why: a warp-per-key dot (five dependent shuffles a key, the decode kernel's form)
// took 1.47 ms of a 512-token batch's layer (deepseek-v2-lite, H200 ncu), a third of it.
// The key rows are staged at a stride of an odd number of float4 (prefill_stride), so a
// quarter warp's 16-byte loads of eight rows meet eight distinct bank quads.
constexpr int kPrefillKeys = 32;
__host__ __device__ inline int64_t prefill_stride(int64_t width) { return (width / 4) % 2 ? width : width + 4; }
inline size_t prefill_smem(int64_t width) {
  return static_cast<size_t>(kHeads * width + kPrefillKeys * prefill_stride(width)) * sizeof(float);
}

__global__ void __launch_bounds__(kHeads * 32) mla_prefill_kernel(MlaAttnParams p) {
  extern __shared__ float4 smem4[];
  const int W = static_cast<int>(p.width), R = static_cast<int>(p.rank), KS = static_cast<int>(prefill_stride(W));
  float* qs = reinterpret_cast<float*>(smem4);  // [kHeads][W]
  float* ks = qs + kHeads * W;                  // [kPrefillKeys][KS]
  const int64_t t = blockIdx.y, h = blockIdx.x * int64_t{kHeads} + threadIdx.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool live = h < p.n_head;  // warp-uniform: a last block's spare warps only stage rows
  const int64_t n_keys = *p.pos + t + 1;
  if (live) {
    const float4* qh = reinterpret_cast<const float4*>(p.q + (t * p.n_head + h) * W);
    for (int e = lane; e < W / 4; e += 32) reinterpret_cast<float4*>(qs + warp * W)[e] = qh[e];
  }
  float m = -INFINITY, l = 0.0f, acc[kVPer];
#pragma unroll
  for (int i = 0; i < kVPer; ++i) acc[i] = 0.0f;
  const float4* q4 = reinterpret_cast<const float4*>(qs + warp * W);
  const float4* k4 = reinterpret_cast<const float4*>(ks + lane * KS);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kPrefillKeys) {
    const int nr = static_cast<int>(min(int64_t{kPrefillKeys}, n_keys - j0));
    __syncthreads();  // the last tile's readers are done (and, the first time, q is staged)
    const float4* src = reinterpret_cast<const float4*>(p.rows + j0 * W);
    for (int e = threadIdx.x; e < nr * W / 4; e += blockDim.x) {
      const int r = e / (W / 4), c = e % (W / 4);
      reinterpret_cast<float4*>(ks + r * KS)[c] = src[e];
    }
    __syncthreads();
    if (!live) continue;
    float s = -INFINITY;
    if (lane < nr) {
      float d = 0.0f;
      for (int c = 0; c < W / 4; ++c) {
        const float4 a = q4[c], b = k4[c];
        d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
      s = d * p.scale;
    }
    float tmax = s;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
    const float m_new = fmaxf(m, tmax), corr = expf(m - m_new), e = expf(s - m_new);
    float sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    l = l * corr + sum;
#pragma unroll
    for (int i = 0; i < kVPer; ++i) acc[i] *= corr;
    for (int j = 0; j < nr; ++j) {
      const float pj = __shfl_sync(0xffffffffu, e, j);
      const float* row = ks + j * KS;
#pragma unroll
      for (int i = 0; i < kVPer; ++i)
        if (lane + 32 * i < R) acc[i] += pj * row[lane + 32 * i];
    }
    m = m_new;
  }
  if (!live) return;
  const int64_t row = t * p.n_head + h;
#pragma unroll
  for (int i = 0; i < kVPer; ++i) {
    if (32 * i >= R) break;  // warp-uniform
    const float v = lane + 32 * i < R ? acc[i] / l : 0.0f;
    if (lane + 32 * i < R) p.out[row * R + lane + 32 * i] = v;
    if (p.out_q8) q8_store(p, row, 32 * i, v);
  }
}

// grid (n_head, n_tok): the splits holding keys of (token, head) weighed against their max.
// Every split below s1 was written (it holds at least one key, so its max is finite).
__global__ void __launch_bounds__(kMergeThreads) mla_merge_kernel(MlaAttnParams p, int64_t n_split, int64_t chunk) {
  const int64_t h = blockIdx.x, t = blockIdx.y, stride = 2 + p.rank;
  const int64_t s1 = min(n_split, (*p.pos + t + chunk) / chunk);  // ceil((pos0 + t + 1) / chunk)
  const float* part = p.partial + (t * p.n_head + h) * n_split * stride;
  float mm = -INFINITY;
  for (int64_t s = 0; s < s1; ++s) mm = fmaxf(mm, part[s * stride]);
  float ll = 0.0f;
  for (int64_t s = 0; s < s1; ++s) ll += part[s * stride + 1] * expf(part[s * stride] - mm);
  float* out = p.out + (t * p.n_head + h) * p.rank;
  // Whole warps walk the row (rank % 32 == 0 with out_q8), so each holds whole Q8_0 blocks.
  for (int64_t d0 = threadIdx.x / 32 * 32; d0 < p.rank; d0 += blockDim.x) {
    const int64_t d = d0 + threadIdx.x % 32;
    float a = 0.0f;
    if (d < p.rank)
      for (int64_t s = 0; s < s1; ++s) a += part[s * stride + 2 + d] * expf(part[s * stride] - mm);
    if (d < p.rank) out[d] = a / ll;
    if (p.out_q8) q8_store(p, t * p.n_head + h, d0, a / ll);
  }
}

// grid (n_head + 1, n_tok): block h < n_head takes head h's query, block n_head the cache row.
constexpr int kPrepThreads = 256;
__global__ void __launch_bounds__(kPrepThreads) mla_prep_kernel(MlaPrepParams p) {
  const int64_t t = blockIdx.y, h = blockIdx.x, pos = *p.pos + t, half = p.n_rot / 2;
  const int64_t W = p.rank + p.n_rot, nope = p.head_dim - p.n_rot;
  const int lane = threadIdx.x % 32;
  const auto pair = [&](int64_t i) { return p.neox ? make_int2(i, i + half) : make_int2(2 * i, 2 * i + 1); };
  if (h < p.n_head) {
    const int64_t row = t * p.n_head + h;
    const float* qh = p.q + row * p.head_dim;
    float* tail = p.q_abs + row * W + p.rank;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const int2 ab = pair(i);
      const float2 y = rope_rotate(qh[nope + ab.x], qh[nope + ab.y], rope_cos_sin(p.freq, pos, i));
      tail[ab.x] = y.x;
      tail[ab.y] = y.y;
    }
    if (p.q8)  // a warp a 32-block: quantize_q8_kernel's values
      for (int64_t b = threadIdx.x / 32; b < nope / 32; b += blockDim.x / 32) {
        const Q8Elem e = q8_0_warp_block(qh[b * 32 + lane]);
        p.q8[row * nope + b * 32 + lane] = e.q;
        if (lane == 0) p.d8[row * (nope / 32) + b] = e.d;
      }
    return;
  }
  // c = kv_a_norm(kv[:rank]) (RMS), k_pe rotated; the row [c | k_pe] appended
  __shared__ float shared[32];
  const float* kv = p.kv + t * W;
  float* m = p.mirror + pos * W;
  float* st = p.stage + t * W;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.rank; i += blockDim.x) ss += kv[i] * kv[i];
  const float scale = rsqrtf(block_sum(ss, shared) / static_cast<float>(p.rank) + p.eps);
  for (int64_t i = threadIdx.x; i < p.rank; i += blockDim.x) {
    const float v = kv[i] * scale * (p.kv_norm_w ? p.kv_norm_w[i] : 1.0f);
    m[i] = v;
    st[i] = v;
  }
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const int2 ab = pair(i);
    const float2 y = rope_rotate(kv[p.rank + ab.x], kv[p.rank + ab.y], rope_cos_sin(p.freq, pos, i));
    m[p.rank + ab.x] = st[p.rank + ab.x] = y.x;
    m[p.rank + ab.y] = st[p.rank + ab.y] = y.y;
  }
}

}  // namespace

bool mla_attention_supported(int64_t width, int64_t rank) {
  return width > 0 && width % 4 == 0 && rank > 0 && rank <= width && width <= kMlaMaxWidth && rank <= kMlaMaxRank;
}

size_t mla_scratch_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t rank) {
  if (!splits(n_tok)) return 0;
  const int64_t chunk = mla_chunk(max_keys);
  return static_cast<size_t>(n_tok * n_head * ((max_keys + chunk - 1) / chunk) * (2 + rank));
}

void launch_mla_prep(const MlaPrepParams& p) {
  const int64_t nope = p.head_dim - p.n_rot;
  FRINK_CUDA_CHECK(p.pos && p.n_rot % 2 == 0 && nope > 0 && (!p.q8 || (p.d8 && nope % 32 == 0)) ? cudaSuccess
                                                                                               : cudaErrorInvalidValue);
  if (p.n_tok == 0) return;
  mla_prep_kernel<<<dim3(static_cast<unsigned>(p.n_head + 1), static_cast<unsigned>(p.n_tok)), kPrepThreads, 0,
                    p.stream>>>(p);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_mla_attention(const MlaAttnParams& p) {
  FRINK_CUDA_CHECK(mla_attention_supported(p.width, p.rank) && p.pos && p.max_keys >= p.n_tok &&
                           (!splits(p.n_tok) || p.partial) && (!p.out_q8 || (p.out_d8 && p.rank % 32 == 0))
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  if (p.n_tok == 0) return;
  const unsigned head_blocks = static_cast<unsigned>((p.n_head + kHeads - 1) / kHeads);
  if (!splits(p.n_tok)) {
    const size_t smem = prefill_smem(p.width);
    opt_in_smem(reinterpret_cast<const void*>(mla_prefill_kernel), prefill_smem(kMlaMaxWidth));
    mla_prefill_kernel<<<dim3(head_blocks, static_cast<unsigned>(p.n_tok)), kHeads * 32, smem, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t chunk = mla_chunk(p.max_keys), n_split = (p.max_keys + chunk - 1) / chunk;
  mla_attn_kernel<<<dim3(static_cast<unsigned>(n_split), head_blocks, static_cast<unsigned>(p.n_tok)),
                          kHeads * 32, 0, p.stream>>>(p, chunk);
  FRINK_CUDA_CHECK_LAUNCH();
  mla_merge_kernel<<<dim3(static_cast<unsigned>(p.n_head), static_cast<unsigned>(p.n_tok)), kMergeThreads, 0,
                     p.stream>>>(p, n_split, chunk);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
