// Device attention (see attention.cuh).
//
// Notebook (2026-11-30, written without device time; expectations unmeasured):
// - Decode (split-K, n_tok < kAttnPrefillMinTok): the old grouped kernel walked a 256-key
//   split in 8 serial tiles of scalar loads, ~128-512 blocks: latency bound (8B at depth
//   4096/16384: +3.4/+4.1 ms per token whatever the bytes). Now kAttnChunk = 64 keys per
//   split, one tile per block, K and V rows fetched with 16-byte cp.async all at once (one
//   memory round trip per block), thousands of blocks at depth. Each block serves every
//   query head of its KV head (up to 8), so the KV bytes are read once per token. Split-K
//   batches of 8+ queries (head dims > 128 only) walk 8 tiles per split, which keeps their
//   partial scratch at half the old 256-key size. Partial scratch for decode: 4x the old
//   (8B at a 32768-key graph bound: 8.5 MB).
//   Expected: bandwidth bound, 8B depth 16384 ~1.1-1.5 ms of attention per token (4 GiB),
//   depth 4096 ~0.3-0.5 ms.
// - Merge: 256 threads per (token, head), splits spread over 8 warps (was one serial loop
//   per thread over every split, ~0.5 us of L2 latency per split); expected a few us per
//   layer at 512 splits. It may also write its output as Q8_0 blocks (out_q8) for the wo
//   product: ncu (H200 decode) showed a separate quantize_q8_kernel of ~2.2 us per dense
//   Q4_0/Q8_0 layer; in the merge it is one warp reduction per block (unmeasured).
// - Prefill (n_tok >= kAttnMmaMinTok, head dim 64/128/256): flash-attention on tensor cores
//   (mma.sync m16n8k16, f16 inputs converted from the f32 mirror rows in shared memory, f32
//   accumulate and softmax; the next K/V tile's cp.async copies fly during the current
//   tile's products). 2 blocks per SM (250 registers, 101 KiB shared at head dim 128).
//   Expected pp512 at depth 16384 on 8B: attention from ~1.1 s to ~15-25 ms per batch
//   (pp512 ~450 -> ~5000 t/s); depth 4096 ~4-6 ms (1630 -> ~6000 t/s). Smaller batches and
//   other head dims keep the exact f32 tiled kernel (or split-K above 128). Head dim 256
//   (gemma2/3, qwen3-next, qwen3.5) joined later; it took split-K before. Q4_0 synth pp512
//   (H200, calls of one session): gemma3-12b 4472 -> 11994 t/s, qwen3.5-9b (8 attention
//   layers of 32) 7802 -> 8437.
// - Per-head split-K kernel (attn_partial_kernel) stays for head dims not a multiple of 4 or
//   unaligned mirrors; it writes the same partials for the same merge.
// - Risks to watch on the first device run: the >48 KiB opt-in (cudaFuncSetAttribute) may
//   first happen inside a token-graph capture (legal as far as known: flash-attention does
//   it under vLLM's graphs); f16 prefill error grows with logit magnitude (peaked heads with
//   logits ~30: NMSE ~1e-5, still inside the parity bound).
#include "cuda/attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/attention_decode.cuh"
#include "cuda/attention_mma.cuh"
#include "cuda/attention_parts.cuh"
#include "cuda/cuda_check.h"
#include "cuda/occupancy.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_0_rule.cuh"
#include "cuda/q8k_rule.cuh"
#include "cuda/round16_rule.cuh"

namespace frink::cuda {

namespace {

// Per-head split-K (the fallback for head dims that are not a multiple of 4 or mirrors not
// 16-byte aligned), grid (n_split, n_head, n_tok), 4 warps: each warp takes keys of its chunk
// in turn; lanes split the head dimension (d = lane + 32 i), a warp shuffle sums Q.K, and the
// warp keeps an online softmax (max m, sum l, acc[head_dim_v]) in registers. The 4 warps
// merge through shared memory and write (m, l, acc) for the chunk.
__global__ void __launch_bounds__(kWarps * 32) attn_partial_kernel(AttnParams p, int64_t n_split, int64_t chunk) {
  const int64_t split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t hk = h / (p.n_head / p.n_head_kv);
  const KeyRange kr = key_range(p, t);
  const int64_t begin = max(split * chunk, kr.first), end = min(kr.end, split * chunk + chunk);
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

// The merge's threads per head: 8 warps, each folding every 8th split, or in the wide blocks
// (merge_threads) 1024 threads a block. A block merges one head, or for Q8_K output
// (AttnParams::out_sum) the 256 / head_dim_v heads of one 256-block.
constexpr int kMergeThreads = 256;
constexpr int kMergeMaxThreads = 1024, kMergeMaxWarps = kMergeMaxThreads / 32;

// grid (n_head / heads a block, n_tok), merge_threads threads: merges the splits of one
// (token, head). With 64-key splits a deep context has hundreds of them, so the splits are
// spread over the warps (warp w takes splits s0 + w, s0 + w + wph, ...; lanes split the head
// dimension) rather than walked serially by every thread. One pass: a warp folds its splits
// into its own (m, l, acc) as an online softmax (a split's m, l and columns load together),
// then the warps meet in shared memory. (It was three passes, max then sum then the weighted
// columns, with block reductions between: two L2 round trips where a short context's splits
// need one. Graph time per token, H200, one call, alternating: 8B Q4_0 2.202 / 2.202 / 2.201
// -> 2.182 / 2.185 / 2.185 ms, qwen3-30b-a3b 2.863 / 2.863 / 2.865 -> 2.846 / 2.846 / 2.845.)
// With p.out_q8 the output is also quantized: as Q8_0 (head_dim_v % 32 == 0 makes each warp's
// 32 outputs one block) or as Q8_K (out_sum set: the block's 256 outputs are one block); with
// p.out_round, rounded to f16 / bf16.
// A warp loads KB splits (their m, l and columns) before it folds them, in the same order as
// one at a time, so one L2 round trip serves KB splits: a `#pragma unroll 4` loop had ptxas
// issue one split's loads a step (SASS, H200). 8B Q4_0 tg128 graph, H200, one call: depth 4096
// (8-warp blocks) 2.390 / 2.390 -> 2.365 / 2.364 ms; depth 16384 (wide blocks, 128-key
// splits) 3.546 -> 3.508. KP: head-dim elements a lane (hdv <= 32 KP), so the batch's
// registers follow the head dim (KB 4 up to 128, 2 at 256: 4 spilled under the 64-register
// bound of 1024-thread blocks).
// kEven: behind even splits (plan_splits), on the wide blocks (merge_threads); their splits
// are walked all and skipped if empty.
template <int KP, bool kEven>
__global__ void __launch_bounds__(kMergeMaxThreads) attn_merge_kernel(AttnParams p, int64_t n_split, int64_t chunk) {
  __shared__ float s_ml[kMergeMaxWarps][2];
  // [head of the block][warp][d]: heads x hdv <= 256 in the 8-warp blocks
  __shared__ float s_acc[(kEven ? kMergeMaxWarps : kMergeThreads / 32) * kAttnMaxHeadDim];
  __shared__ Q8KShared s_q8k;
  dependent_kernel_start();  // the wo product may start its weight copies (pdl.cuh)
  // Heads a block, warps a head (merge_threads).
  const int hpb = kEven ? static_cast<int>(p.n_head / gridDim.x) : static_cast<int>(blockDim.x) / kMergeThreads;
  const int wph = kEven ? static_cast<int>(blockDim.x) / 32 / hpb : kMergeThreads / 32;
  const int hdv = static_cast<int>(p.head_dim_v), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hh = warp / wph, w8 = warp % wph;
  const int64_t t = blockIdx.y, stride = 2 + p.head_dim_v;
  {
    const int64_t h = blockIdx.x * int64_t{hpb} + hh;
    const float* part = p.partial + (t * p.n_head + h) * n_split * stride;
    // The splits that hold keys of this query: [s0, s1) (min: never past the grid), or the
    // non-empty even splits. Every one of them was written (its keys meet [first, end)), with
    // a finite max.
    const KeyRange kr = key_range(p, t);
    const int64_t s0 = kEven ? 0 : kr.first / chunk, s1 = kEven ? n_split : min(n_split, n_split_for(kr.end, chunk));
    const auto live = [&](int64_t s) {  // even splits may be empty (fewer tiles than splits)
      if constexpr (kEven) {
        const EvenSplit es = even_split(kr, kKsTileKeys, n_split, s);
        return es.lo < es.hi;
      }
      return true;
    };
    constexpr int KB = KP <= 4 ? 4 : 2;
    float m = -INFINITY, l = 0.0f, a[KP] = {};
    for (int64_t s = s0 + w8; s < s1; s += KB * wph) {
      float ms[KB], ls[KB], v[KB][KP];
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        const bool in = s + b * wph < s1 && live(s + b * wph);
        const float* ps = part + (s + b * wph) * stride;
        ms[b] = in ? ps[0] : -INFINITY;
        ls[b] = in ? ps[1] : 0.0f;
#pragma unroll
        for (int i = 0; i < KP; ++i) v[b][i] = in && lane + 32 * i < hdv ? ps[2 + lane + 32 * i] : 0.0f;
      }
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        if (ms[b] == -INFINITY) continue;  // past s1, or empty (a written split's max is finite)
        const float mn = fmaxf(m, ms[b]);
        const float c_old = expf(m - mn), c_new = expf(ms[b] - mn);
        l = l * c_old + ls[b] * c_new;
#pragma unroll
        for (int i = 0; i < KP; ++i) a[i] = a[i] * c_old + v[b][i] * c_new;
        m = mn;
      }
    }
    if (lane == 0) {
      s_ml[warp][0] = m;
      s_ml[warp][1] = l;
    }
#pragma unroll
    for (int i = 0; i < KP; ++i)
      if (lane + 32 * i < hdv) s_acc[warp * hdv + lane + 32 * i] = a[i];
  }
  __syncthreads();
  // Output i of the block (at most one a thread: hdv <= 256 threads, or heads x hdv = 256):
  // head oh's warps' weights against their overall max; a warp without splits (m = -inf)
  // weighs 0. A sink is one more logit in the denominator: a split of weight exp(sink - mm),
  // no value.
  const int i = threadIdx.x, oh = min(i / hdv, hpb - 1), d = i % hdv;
  const bool live = i < hpb * hdv;  // warp-uniform: hdv % 32 == 0 with out_q8
  const int64_t h = blockIdx.x * int64_t{hpb} + oh;
  float mm = -INFINITY;
  for (int w = 0; w < wph; ++w) mm = fmaxf(mm, s_ml[oh * wph + w][0]);
  if (p.sinks) mm = fmaxf(mm, p.sinks[h]);
  float o = 0.0f;
  if (live) {
    float sum = 0.0f, ll = 0.0f;
    for (int w = 0; w < wph; ++w) {
      const float wt = expf(s_ml[oh * wph + w][0] - mm);
      ll += s_ml[oh * wph + w][1] * wt;
      sum += s_acc[(oh * wph + w) * hdv + d] * wt;
    }
    if (p.sinks) ll += expf(p.sinks[h] - mm);
    o = sum / ll;
  }
  const int64_t e = t * p.n_head * p.head_dim_v + blockIdx.x * int64_t{hpb} * hdv + i;  // this output's index
  if (live) p.out[e] = o;
  if (p.out_sum) {  // Q8_K: the block's 256 outputs (attn_writes_q8k); every thread calls it
    const Q8KElem q = q8k_block_256(o, s_q8k);
    if (live) {  // threads past the block's 256 outputs (hpb heads of 8 warps each) store nothing
      p.out_q8[e] = static_cast<int8_t>(q.q);
      if (lane == 0) p.out_sum[e / 32] = q.sum;
      if (i == 0) p.out_d8[e / 256] = q.d;
    }
  } else if (p.out_q8 && live) {
    const Q8Elem q = q8_0_warp_block(o);
    p.out_q8[e] = q.q;
    if (lane == 0) p.out_d8[e / 32] = q.d;
  } else if (p.out_round && live) {
    p.out_round[e] = round16(o, p.out_round_bf16);
  }
}

// Tiled attention (flash-attention's loop on CUDA cores, f32), for prefill batches the
// tensor-core kernel (attention_mma.cuh) does not take (fewer than kAttnMmaMinTok queries, head dims other
// than 64/128, pre-sm_80): a block of kTileWarps warps holds up to kTileWarps query rows that read the same
// KV head, one per warp, and walks their keys in tiles of 32 that the whole block loads once
// into shared memory. The split-K kernel above re-reads every key from L2 for every query
// row: at pp512 on the H200 that was 917 us per layer (28.9% of the batch's kernel time,
// ncu), bound by L2 traffic.
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
  const bool tiled = head_dim_k <= kTileMaxDim && head_dim_v <= kTileMaxDim;
  return n_tok < kAttnPrefillMinTok || !(tiled || attn_uses_tensor_cores(n_tok, head_dim_k, head_dim_v));
}

bool attn_writes_q8_0(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v) {
  return attn_uses_split_k(n_tok, head_dim_k, head_dim_v) && head_dim_v % 32 == 0;
}

bool attn_writes_q8k(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v, int64_t n_head) {
  const bool whole = head_dim_v == 64 || head_dim_v == 128 || head_dim_v == 256;  // 256 / hdv heads a block, at most 4
  return attn_uses_split_k(n_tok, head_dim_k, head_dim_v) && whole && n_head % (256 / head_dim_v) == 0;
}

bool attn_uses_tensor_cores(int64_t n_tok, int64_t head_dim_k, int64_t head_dim_v) {
  return n_tok >= kAttnMmaMinTok && head_dim_k == head_dim_v &&
         (head_dim_k == 64 || head_dim_k == 128 || head_dim_k == 256);
}

size_t attn_scratch_floats(int64_t n_tok, int64_t max_keys, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
                           int64_t head_dim_v) {
  if (!attn_uses_split_k(n_tok, head_dim_k, head_dim_v)) {
    if (!attn_uses_tensor_cores(n_tok, head_dim_k, head_dim_v)) return 0;
    const int64_t tiles = n_head_kv * kv16_tiles(max_keys);  // f16 K and V: a float a key and dim
    return static_cast<size_t>(tiles * kMmaKeys * head_dim_k + (tiles + 3) / 4);  // + the flag bytes
  }
  // The smallest split a batch of n_tok may take: for decode, the decode kernel's tile
  // (decode_tile_keys) or the fallback kernel's split_keys, whichever is smaller.
  const int64_t chunk = n_tok < kAttnPrefillMinTok ? std::min(split_keys(n_tok), decode_tile_keys(max_keys))
                                                   : split_keys(n_tok);
  return static_cast<size_t>(n_tok * n_head * n_split_for(max_keys, chunk) * (2 + head_dim_v));
}

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The current device's compute capability (major) and opt-in shared memory per block.
struct DeviceLimits {
  int major = 0, smem_optin = 0;
};
DeviceLimits device_limits() {
  int dev = 0;
  DeviceLimits d;
  FRINK_CUDA_CHECK(cudaGetDevice(&dev));
  FRINK_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  FRINK_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return d;
}

// Query heads per decode block: the largest divisor of the group up to kDecMaxHeads.
int decode_heads_per_block(int64_t group) {
  for (int hb = kDecMaxHeads; hb > 1; --hb)
    if (group % hb == 0) return hb;
  return 1;
}

// The decode kernel for TK-key tiles.
using DecodeKernel = void (*)(AttnParams, int64_t, int, int);
DecodeKernel decode_kernel(int64_t tk, bool ks, int hb) {
  if (ks) return hb <= 4 ? attn_decode_kernel<kKsTileKeys, true, 4> : attn_decode_kernel<kKsTileKeys, true>;  // even splits (plan_splits)
  return tk == 16 ? attn_decode_kernel<16, false> : tk == 32 ? attn_decode_kernel<32, false> : attn_decode_kernel<kAttnChunk, false>;
}

// How a split-K batch runs: the decode kernel (head dims % 4, 16-byte rows, its shared memory
// for 64-key tiles fits) with hb query heads per block and tk-key tiles, or the per-head
// fallback; keys per split (chunk).
struct SplitPlan {
  bool dec_kernel = false;
  int hb = 1;
  int64_t tk = kAttnChunk;
  size_t dec_smem = 0;
  int64_t chunk = 0, resident = 0;  // resident: decode blocks the device holds at once (0: not asked)
  bool key_sets = false;            // the decode kernel's KS form (even splits)
  int64_t even_splits = 0;          // the KS form's splits (chunk 0): each token's tiles over this many
};
SplitPlan plan_splits(const AttnParams& p, const DeviceLimits& dl) {
  SplitPlan sp;
  sp.hb = decode_heads_per_block(p.n_head / p.n_head_kv);
  const auto smem_for = [&](int64_t tk) {
    return static_cast<size_t>(dec_smem_floats(tk, p.head_dim_k, p.head_dim_v, sp.hb, sp.key_sets)) * sizeof(float);
  };
  sp.dec_kernel = p.head_dim_k % 4 == 0 && p.head_dim_v % 4 == 0 && aligned16(p.k) && aligned16(p.v) &&
                  smem_for(kAttnChunk) <= static_cast<size_t>(dl.smem_optin);
  sp.chunk = split_keys(p.n_tok);
  if (!sp.dec_kernel) return sp;
  // Takes tk-key tiles: opts in to their shared memory (to the most any shape takes: a launch
  // still allocates only what it asks; before the occupancy query, which counts no block whose
  // shared memory is not opted in) and returns the decode blocks the device holds at once.
  const auto take = [&](int64_t tk) {
    sp.tk = tk;
    sp.dec_smem = smem_for(tk);
    const int64_t most = dec_smem_floats(tk, kAttnMaxHeadDim, kAttnMaxHeadDim, kDecMaxHeads, sp.key_sets) * sizeof(float);
    const void* kernel = reinterpret_cast<const void*>(decode_kernel(tk, sp.key_sets, sp.hb));
    opt_in_smem(kernel, static_cast<size_t>(most));
    return resident_blocks(kernel, kDecThreads, sp.dec_smem);
  };
  if (p.n_tok >= kAttnPrefillMinTok) {
    take(kAttnChunk);  // split_keys' 8 tiles a split
    return sp;
  }
  sp.resident = take(decode_tile_keys(p.max_keys));
  if (sp.tk < kAttnChunk) {
    sp.chunk = sp.tk;
    return sp;
  }
  // Longer grids walk 32-key tiles: half the shared memory of one 64-key tile, so twice the
  // blocks resident (8B at depth 4096: 512 blocks against 396 a wave of 64-key tiles held).
  // 64-key splits of two such tiles, or, where the two-tile rule holds, even splits on the KS
  // kernel. tg128 @ d4096 graph (H200, one call): 64 x 1 2.921 ms, 32 x 1 2.826, 64 x 2 2.863,
  // 16 x 1 3.250, 32 x 2 2.720. At depth 16384 with key sets (tg64 graph, one call): 64 x 2
  // 3.842 / 3.855 ms, 32 x 4 3.730 / 3.724; before them (tg128) 64 x 2 4.524 against 32 x 2
  // 4.705 and 64 x 1 4.648.
  // Even splits: as many splits as fill one wave of the KS kernel's resident blocks, each
  // token's 32-key tiles shared out evenly over them (even_split), so a block walks T / n or
  // T / n + 1 tiles. Why: 128-key splits at depth 16.5k gave 1032 blocks for 792 resident (8B,
  // H200): 1.3 waves, the second a third full. 8B Q4_0 tg128 graph at depth 16384 (H200, one
  // call): 128-key splits 3.546 ms, even over one wave 3.407, over two waves 3.580.
  const bool four = decode_split_tiles(p.max_keys, p.n_head / sp.hb * p.n_tok, sp.resident) == 2;
  sp.key_sets = four;
  sp.resident = take(32);
  sp.chunk = four ? 0 : kAttnChunk;
  if (four)  // at most the splits attn_scratch_floats makes room for (kAttnChunk keys each)
    sp.even_splits = std::clamp<int64_t>(sp.resident / (p.n_head / sp.hb * p.n_tok), 1, n_split_for(p.max_keys, kAttnChunk));
  return sp;
}

// Threads of a merge block: 8 warps a head, or in the wide blocks, behind even splits (the
// longest contexts), up to 1024: 32 warps a head at head dim 256, 16 at 128. Why: a warp's
// splits were a chain of L2 round trips (SASS: ptxas issued one split's loads per step under
// the 64-register bound), and 8 warps over 129 splits a head took 17 us a layer (ncu, H200,
// 8B at depth 16384) with 32 blocks on the GPU. Measured with 32 warps a head (8B Q4_0 tg64
// graph, H200, one call, two rounds): at depth 16384 4.21 -> 4.12-4.13 ms (3.94 -> 3.84-3.86
// with the key-set P.V); at depth 4096 (64-key splits) 2.54 -> 2.61, hence not there.
// The wide blocks' warps a head depend on the head dim alone (at most 256 / hdv heads share a
// block, for Q8_K output), so a head's splits fold in the same order whatever the output's
// format: the f32 output is the same bits with and without its Q8 blocks.
int merge_threads(bool wide, int64_t hdv, int hpb) {
  if (!wide) return kMergeThreads * hpb;
  const int64_t wph = std::clamp<int64_t>(kMergeMaxWarps * hdv / 256, kMergeThreads / 32, kMergeMaxWarps);
  return static_cast<int>(wph * 32 * hpb);
}

// The merge kernel for head dim hdv: head-dim elements a lane KP = 2, 4 or 8 (hdv <= 32 KP).
template <bool kEven>
auto merge_kernel(int64_t hdv) {
  return hdv <= 64 ? attn_merge_kernel<2, kEven> : hdv <= 128 ? attn_merge_kernel<4, kEven> : attn_merge_kernel<8, kEven>;
}

}  // namespace

AttnSplit attn_split(const AttnParams& p) {
  const SplitPlan sp = plan_splits(p, device_limits());
  return {sp.tk, sp.chunk, sp.even_splits};
}

// The tensor-core prefill at head dim D, where its block fits the device's shared-memory opt-in;
// false, launching nothing, where it does not.
template <int D>
bool launch_prefill_mma(const AttnParams& p, const DeviceLimits& dl) {
  if (sizeof(MmaTile<D>) > static_cast<size_t>(dl.smem_optin)) return false;
  FRINK_CUDA_CHECK(p.partial ? cudaSuccess : cudaErrorInvalidValue);  // the f16 copy's scratch
  const unsigned n_blk = static_cast<unsigned>((p.n_tok + kMmaRows - 1) / kMmaRows);
  const dim3 kv_grid(static_cast<unsigned>(kv16_tiles(p.max_keys)), static_cast<unsigned>(p.n_head_kv));
  kv16_kernel<D><<<kv_grid, kKv16Threads, 0, p.stream>>>(p);
  opt_in_smem(reinterpret_cast<const void*>(attn_prefill_mma_kernel<D>), sizeof(MmaTile<D>));
  attn_prefill_mma_kernel<D>
      <<<dim3(n_blk, static_cast<unsigned>(p.n_head)), kMmaWarps * 32, sizeof(MmaTile<D>), p.stream>>>(p);
  return true;
}

void launch_attention(const AttnParams& p) {
  FRINK_CUDA_CHECK(p.head_dim_k <= kAttnMaxHeadDim && p.head_dim_v <= kAttnMaxHeadDim && p.n_head_kv > 0 &&
                           p.n_head % p.n_head_kv == 0 && p.pos && p.max_keys >= p.n_tok &&
                           (!p.out_q8 || (p.out_d8 && (p.out_sum ? attn_writes_q8k(p.n_tok, p.head_dim_k, p.head_dim_v, p.n_head)
                                                                 : attn_writes_q8_0(p.n_tok, p.head_dim_k, p.head_dim_v)))) &&
                           (!p.out_round || (!p.out_q8 && attn_uses_split_k(p.n_tok, p.head_dim_k, p.head_dim_v)))
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  if (p.n_tok == 0) return;
  const DeviceLimits dl = device_limits();
  const bool rows16 = aligned16(p.k) && aligned16(p.v);  // K/V rows as float4: base aligned, widths % 4
  if (!attn_uses_split_k(p.n_tok, p.head_dim_k, p.head_dim_v)) {
    const unsigned n_head = static_cast<unsigned>(p.n_head);
    // The head dim chosen once: its tensor-core kernel launched where the block fits.
    const bool mma = attn_uses_tensor_cores(p.n_tok, p.head_dim_k, p.head_dim_v) && dl.major >= 8 && rows16 &&
                     (p.head_dim_k == 64    ? launch_prefill_mma<64>(p, dl)
                      : p.head_dim_k == 128 ? launch_prefill_mma<128>(p, dl)
                                            : launch_prefill_mma<256>(p, dl));
    // Head dims above kTileMaxDim have no other prefill kernel (attn_uses_split_k counted on
    // this one): sm_80+ is the device probe's floor and the mirrors are cudaMalloc'd.
    FRINK_CUDA_CHECK(mma || p.head_dim_k <= kTileMaxDim ? cudaSuccess : cudaErrorInvalidValue);
    if (!mma)
      attn_prefill_kernel<<<dim3(static_cast<unsigned>((p.n_tok + kTileWarps - 1) / kTileWarps), n_head),
                            kTileWarps * 32, 0, p.stream>>>(p);
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  const SplitPlan sp = plan_splits(p, dl);
  const int hb = sp.hb;
  const size_t dec_smem = sp.dec_smem;
  const int64_t chunk = sp.chunk, n_split = sp.even_splits ? sp.even_splits : n_split_for(p.max_keys, chunk);
  if (sp.dec_kernel) {  // opted in to its shared memory by plan_splits
    launch_dependent(decode_kernel(sp.tk, sp.key_sets, sp.hb),
                     dim3(static_cast<unsigned>(n_split), static_cast<unsigned>(p.n_head / hb),
                          static_cast<unsigned>(p.n_tok)),
                     kDecThreads, dec_smem, p.stream, p, n_split, hb, static_cast<int>(chunk / sp.tk));  // even splits: 0
  } else {
    attn_partial_kernel<<<dim3(static_cast<unsigned>(n_split), static_cast<unsigned>(p.n_head),
                               static_cast<unsigned>(p.n_tok)),
                          kWarps * 32, 0, p.stream>>>(p, n_split, chunk);
  }
  FRINK_CUDA_CHECK_LAUNCH();
  const int hpb = p.out_sum ? static_cast<int>(256 / p.head_dim_v) : 1;  // heads a merge block
  const bool even = sp.even_splits > 0;
  launch_dependent(even ? merge_kernel<true>(p.head_dim_v) : merge_kernel<false>(p.head_dim_v),
                   dim3(static_cast<unsigned>(p.n_head / hpb), static_cast<unsigned>(p.n_tok)),
                   static_cast<unsigned>(merge_threads(even, p.head_dim_v, hpb)), 0, p.stream, p, n_split, chunk);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
