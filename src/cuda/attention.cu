// Split-K attention (see attention.cuh).
//
// Kernel 1, grid (n_split, n_head, n_tok), 4 warps: each warp takes keys of its chunk in
// turn; lanes split the head dimension (d = lane + 32 i), a warp shuffle sums Q.K, and the
// warp keeps an online softmax (max m, sum l, acc[head_dim_v]) in registers. The 4 warps
// merge through shared memory and write (m, l, acc) for the chunk. Kernel 2 merges chunks.
// Chunks entirely past a query's last key return at once and are never read by the merge.
#include "cuda/attention.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"

namespace frink::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kPer = kAttnMaxHeadDim / 32;  // head-dim elements per lane

__host__ __device__ int64_t n_split_for(int64_t n_keys) { return (n_keys + kAttnChunk - 1) / kAttnChunk; }

// The keys query t sees: [first, end), end = pos + 1; a window keeps the last `window` of
// them (llama.cpp's is_masked_swa, standard type, as the host).
struct KeyRange {
  int64_t pos, first, end;
};
__device__ __forceinline__ KeyRange key_range(const AttnParams& p, int64_t t) {
  const int64_t pos = *p.pos + t;
  return {pos, p.window > 0 ? max(int64_t{0}, pos - p.window + 1) : int64_t{0}, pos + 1};
}

// Q.K of key j for head h's query at pos -> its logit: scale, softcap, then the ALiBi bias
// (the host's order).
__device__ __forceinline__ float attn_logit(const AttnParams& p, float dot, int64_t h, int64_t pos, int64_t j) {
  float s = dot * p.scale;
  if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
  if (p.alibi_slopes) s -= p.alibi_slopes[h] * static_cast<float>(pos - j);
  return s;
}

__global__ void __launch_bounds__(kWarps * 32) attn_partial_kernel(AttnParams p, int64_t n_split) {
  const int64_t split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t hk = h / (p.n_head / p.n_head_kv);
  const KeyRange kr = key_range(p, t);
  const int64_t begin = max(split * kAttnChunk, kr.first), end = min(kr.end, split * kAttnChunk + kAttnChunk);
  if (begin >= end) return;  // a split outside this query's keys (the grid is sized by max_keys;
                             // a window starts late): the merge reads only splits with keys
  const int64_t kw = p.n_head_kv * p.head_dim_k, vw = p.n_head_kv * p.head_dim_v;
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v);

  float q[kPer];
  const float* qh = p.q + t * p.q_stride + h * p.head_dim_k;
#pragma unroll
  for (int i = 0; i < kPer; ++i) q[i] = lane + 32 * i < hdk ? qh[lane + 32 * i] : 0.0f;

  float m = -INFINITY, l = 0.0f, acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  for (int64_t j = begin + warp; j < end; j += kWarps) {
    const float* kj = p.k + j * kw + hk * p.head_dim_k;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < hdk) s += q[i] * kj[lane + 32 * i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s = attn_logit(p, s, h, kr.pos, j);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), e = expf(s - m_new);
    l = l * corr + e;
    const float* vj = p.v + j * vw + hk * p.head_dim_v;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < hdv) acc[i] = acc[i] * corr + e * vj[lane + 32 * i];
    m = m_new;
  }

  // Merge the warps: per warp (m, l) and acc[head_dim_v].
  __shared__ float s_ml[kWarps][2];
  __shared__ float s_acc[kWarps][kAttnMaxHeadDim];
  if (lane == 0) {
    s_ml[warp][0] = m;
    s_ml[warp][1] = l;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < hdv) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float* out = p.partial + ((t * p.n_head + h) * n_split + split) * (2 + p.head_dim_v);
  float mm = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, s_ml[w][0]);
  if (threadIdx.x == 0) {
    float ll = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (s_ml[w][0] != -INFINITY) ll += s_ml[w][1] * expf(s_ml[w][0] - mm);
    out[0] = mm;
    out[1] = ll;
  }
  for (int d = threadIdx.x; d < hdv; d += kWarps * 32) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (s_ml[w][0] != -INFINITY) a += s_acc[w][d] * expf(s_ml[w][0] - mm);
    out[2 + d] = a;
  }
}

// grid (n_head, n_tok), 128 threads: merges the chunks of one (token, head).
__global__ void attn_merge_kernel(AttnParams p, int64_t n_split) {
  const int64_t h = blockIdx.x, t = blockIdx.y;
  const int64_t stride = 2 + p.head_dim_v;
  const float* part = p.partial + (t * p.n_head + h) * n_split * stride;
  // The splits that hold keys of this query: [s0, s1) (min: never past the grid).
  const KeyRange kr = key_range(p, t);
  const int64_t s0 = kr.first / kAttnChunk, s1 = min(n_split, n_split_for(kr.end));
  // A sink is one more logit in the denominator: a split of weight exp(sink - mm), no value.
  float mm = p.sinks ? p.sinks[h] : -INFINITY;
  for (int64_t s = s0; s < s1; ++s) mm = fmaxf(mm, part[s * stride]);
  float ll = p.sinks ? expf(p.sinks[h] - mm) : 0.0f;
  for (int64_t s = s0; s < s1; ++s) ll += part[s * stride + 1] * expf(part[s * stride] - mm);
  float* out = p.out + t * p.n_head * p.head_dim_v + h * p.head_dim_v;
  for (int64_t d = threadIdx.x; d < p.head_dim_v; d += blockDim.x) {
    float a = 0.0f;
    for (int64_t s = s0; s < s1; ++s) a += part[s * stride + 2 + d] * expf(part[s * stride] - mm);
    out[d] = a / ll;
  }
}

// Tiled attention (flash-attention's loop on CUDA cores, f32), for prefill and for grouped
// decode: a block of kTileWarps warps holds up to kTileWarps query rows that read the same
// KV head, one per warp, and walks their keys in tiles of 32 that the whole block loads once
// into shared memory. The split-K kernel above re-reads every key from L2 for every query
// row: at pp512 on the H200 that was 917 us per layer (28.9% of the batch's kernel time,
// ncu), bound by L2 traffic; in decode it reads each key once per query head of a group.
// Scoring is lane-per-key (lane j dots its key with the query, which every lane reads from
// shared memory as a broadcast; K rows padded to an odd stride so the lanes' reads hit
// distinct banks), then one online-softmax update per tile, and the V accumulation splits
// the head dimension across lanes (d = lane + 32 i) with each key's weight broadcast by
// shuffle. Same arithmetic as the reference softmax up to f32 summation order.
constexpr int kTileWarps = 8;     // query rows per block
constexpr int kTileKeys = 32;     // keys per tile: one per lane
constexpr int kTileMaxDim = 128;  // head dims above this take the split-K kernel
constexpr int kTilePer = kTileMaxDim / 32;

struct KvTile {
  float q[kTileWarps][kTileMaxDim];
  float k[kTileKeys * (kTileMaxDim + 1)];  // rows of odd stride head_dim_k | 1 (distinct banks)
  float v[kTileKeys][kTileMaxDim];
};

struct Online {  // one query row's running softmax: max, sum of weights, weighted V
  float m = -INFINITY, l = 0.0f, acc[kTilePer] = {};
};

// The whole block: keys [j0, j0 + n_tile) of KV head hk into the tile.
__device__ __forceinline__ void load_kv_tile(const AttnParams& p, int64_t hk, int64_t j0, int n_tile, KvTile& sm) {
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v), ks = hdk | 1;
  const int64_t kw = p.n_head_kv * p.head_dim_k, vw = p.n_head_kv * p.head_dim_v;
  for (int i = threadIdx.x; i < n_tile * hdk; i += blockDim.x) {
    const int j = i / hdk, d = i % hdk;
    sm.k[j * ks + d] = p.k[(j0 + j) * kw + hk * p.head_dim_k + d];
  }
  for (int i = threadIdx.x; i < n_tile * hdv; i += blockDim.x) {
    const int j = i / hdv, d = i % hdv;
    sm.v[j][d] = p.v[(j0 + j) * vw + hk * p.head_dim_v + d];
  }
}

// Whether the tile [j0, j0 + n_tile) holds any key of range kr (warp-uniform).
__device__ __forceinline__ bool tile_sees(const KeyRange& kr, int64_t j0, int n_tile) {
  return j0 < kr.end && j0 + n_tile > kr.first;
}

// One warp, head h's query row q (in shared memory): the tile's keys j0 + j with j < n_tile
// inside kr update st. Precondition: tile_sees(kr, j0, n_tile) (so the tile's max is finite).
__device__ __forceinline__ void attend_tile(const AttnParams& p, const float* q, const KvTile& sm, int64_t j0,
                                            int n_tile, const KeyRange& kr, int64_t h, Online& st) {
  const int lane = threadIdx.x % 32;
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v);
  const int64_t j = j0 + lane;
  float s = -INFINITY;
  if (lane < n_tile && j >= kr.first && j < kr.end) {
    const float* krow = sm.k + lane * (hdk | 1);
    float dot = 0.0f;
    for (int d = 0; d < hdk; ++d) dot += q[d] * krow[d];
    s = attn_logit(p, dot, h, kr.pos, j);
  }
  float m_tile = s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, o));
  const float m_new = fmaxf(st.m, m_tile);
  const float corr = expf(st.m - m_new), e = expf(s - m_new);
  float e_sum = e;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) e_sum += __shfl_xor_sync(0xffffffffu, e_sum, o);
  st.l = st.l * corr + e_sum;
#pragma unroll
  for (int i = 0; i < kTilePer; ++i) st.acc[i] *= corr;
  for (int j = 0; j < n_tile; ++j) {
    const float ej = __shfl_sync(0xffffffffu, e, j);
#pragma unroll
    for (int i = 0; i < kTilePer; ++i)
      if (lane + 32 * i < hdv) st.acc[i] += ej * sm.v[j][lane + 32 * i];
  }
  st.m = m_new;
}

// Causal prefill: grid (ceil(n_tok / kTileWarps), n_head); warp w takes token t0 + w of head h.
__global__ void __launch_bounds__(kTileWarps * 32) attn_prefill_kernel(AttnParams p) {
  __shared__ KvTile sm;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTileWarps, t = t0 + warp;
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v);
  const KeyRange kr = key_range(p, t);                                            // this warp's query
  const int64_t block_first = key_range(p, t0).first;                             // the block's first query
  const int64_t block_end = key_range(p, min(p.n_tok, t0 + kTileWarps) - 1).end;  // and its last
  const bool live = t < p.n_tok;

  if (live) {
    const float* qh = p.q + t * p.q_stride + h * p.head_dim_k;
    for (int d = lane; d < hdk; d += 32) sm.q[warp][d] = qh[d];
  }
  Online st;
  for (int64_t j0 = block_first; j0 < block_end; j0 += kTileKeys) {
    __syncthreads();  // the previous tile is no longer read (and q is written, the first time)
    const int n_tile = static_cast<int>(min(static_cast<int64_t>(kTileKeys), block_end - j0));
    load_kv_tile(p, hk, j0, n_tile, sm);
    __syncthreads();
    if (live && tile_sees(kr, j0, n_tile)) attend_tile(p, sm.q[warp], sm, j0, n_tile, kr, h, st);  // warp-uniform
  }
  if (!live) return;
  // A sink is one more logit in the denominator, weighting no value.
  float l = st.l, c = 1.0f;
  if (p.sinks) {
    const float sink = p.sinks[h], mm = fmaxf(st.m, sink);
    c = expf(st.m - mm);
    l = l * c + expf(sink - mm);
  }
  float* out = p.out + t * p.n_head * p.head_dim_v + h * p.head_dim_v;
#pragma unroll
  for (int i = 0; i < kTilePer; ++i)
    if (lane + 32 * i < hdv) out[lane + 32 * i] = st.acc[i] * c / l;
}

// Split-K decode for grouped heads: grid (n_split, n_head_kv, n_tok); warp w takes query head
// hk * G + w (G = n_head / n_head_kv <= kTileWarps), so a split's keys are read once for the
// whole group. Writes the same partials (m, l, acc) as attn_partial_kernel, for the same merge.
__global__ void __launch_bounds__(kTileWarps * 32) attn_gqa_partial_kernel(AttnParams p, int64_t n_split) {
  __shared__ KvTile sm;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t split = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
  const int64_t group = p.n_head / p.n_head_kv, h = hk * group + warp;
  const KeyRange kr = key_range(p, t);
  const int64_t begin = max(split * kAttnChunk, kr.first), end = min(kr.end, split * kAttnChunk + kAttnChunk);
  if (begin >= end) return;  // block-uniform: a split outside this token's keys (the merge skips it)
  const bool live = warp < group;
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v);
  if (live) {
    const float* qh = p.q + t * p.q_stride + h * p.head_dim_k;
    for (int d = lane; d < hdk; d += 32) sm.q[warp][d] = qh[d];
  }
  Online st;
  for (int64_t j0 = begin; j0 < end; j0 += kTileKeys) {
    __syncthreads();
    const int n_tile = static_cast<int>(min(static_cast<int64_t>(kTileKeys), end - j0));
    load_kv_tile(p, hk, j0, n_tile, sm);
    __syncthreads();
    if (live) attend_tile(p, sm.q[warp], sm, j0, n_tile, kr, h, st);
  }
  if (!live) return;
  float* out = p.partial + ((t * p.n_head + h) * n_split + split) * (2 + p.head_dim_v);
  if (lane == 0) {
    out[0] = st.m;
    out[1] = st.l;
  }
#pragma unroll
  for (int i = 0; i < kTilePer; ++i)
    if (lane + 32 * i < hdv) out[2 + lane + 32 * i] = st.acc[i];
}

// One thread per float of the new rows; row t of the batch lands at mirror row *pos + t.
__global__ void kv_append_kernel(const float* k, const float* v, int64_t k_w, int64_t v_w, int64_t n_tok,
                                 const int32_t* pos, float* mk, float* mv, float* sk, float* sv) {
  const int64_t w = k_w + v_w, row0 = *pos;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_tok * w; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / w, j = i % w;
    if (j < k_w) {
      const float x = k[t * k_w + j];
      mk[(row0 + t) * k_w + j] = x;
      sk[t * k_w + j] = x;
    } else {
      const float x = v[t * v_w + (j - k_w)];
      mv[(row0 + t) * v_w + (j - k_w)] = x;
      sv[t * v_w + (j - k_w)] = x;
    }
  }
}

}  // namespace

void launch_kv_append(const float* k, const float* v, int64_t k_width, int64_t v_width, int64_t n_tok,
                      const int32_t* pos, float* mirror_k, float* mirror_v, float* stage_k, float* stage_v,
                      cudaStream_t stream) {
  const int64_t n = n_tok * (k_width + v_width);
  if (n == 0) return;
  kv_append_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, stream>>>(
      k, v, k_width, v_width, n_tok, pos, mirror_k, mirror_v, stage_k, stage_v);
  FRINK_CUDA_CHECK_LAUNCH();
}

bool attn_uses_split_k(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v) {
  return n_tok < kAttnPrefillMinTok || head_dim_k > kTileMaxDim || head_dim_v > kTileMaxDim;
}

size_t attn_partial_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t head_dim_v) {
  return static_cast<size_t>(n_tok * n_head * n_split_for(max_keys) * (2 + head_dim_v));
}

void launch_attention(const AttnParams& p) {
  FRINK_CUDA_CHECK(p.head_dim_k <= kAttnMaxHeadDim && p.head_dim_v <= kAttnMaxHeadDim && p.n_head_kv > 0 &&
                           p.n_head % p.n_head_kv == 0 && p.pos && p.max_keys >= p.n_tok
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const bool tiled = p.head_dim_k <= kTileMaxDim && p.head_dim_v <= kTileMaxDim;
  if (!attn_uses_split_k(p.n_tok, p.head_dim_k, p.head_dim_v)) {
    attn_prefill_kernel<<<dim3(static_cast<unsigned>((p.n_tok + kTileWarps - 1) / kTileWarps),
                               static_cast<unsigned>(p.n_head)),
                          kTileWarps * 32, 0, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t n_split = n_split_for(p.max_keys), group = p.n_head / p.n_head_kv;
  // Groups of 4 to 8 query heads (Llama-3, Qwen3, Mistral) share each key read; with fewer,
  // most of the tiled kernel's warps would idle, so the per-head kernel keeps them.
  if (tiled && group >= 4 && group <= kTileWarps) {
    attn_gqa_partial_kernel<<<dim3(static_cast<unsigned>(n_split), static_cast<unsigned>(p.n_head_kv),
                                   static_cast<unsigned>(p.n_tok)),
                              kTileWarps * 32, 0, p.stream>>>(p, n_split);
  } else {
    attn_partial_kernel<<<dim3(static_cast<unsigned>(n_split), static_cast<unsigned>(p.n_head),
                               static_cast<unsigned>(p.n_tok)),
                          kWarps * 32, 0, p.stream>>>(p, n_split);
  }
  FRINK_CUDA_CHECK_LAUNCH();
  attn_merge_kernel<<<dim3(static_cast<unsigned>(p.n_head), static_cast<unsigned>(p.n_tok)), 128, 0, p.stream>>>(
      p, n_split);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
