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

#include "cuda/cuda_check.h"
#include "cuda/occupancy.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_0_rule.cuh"
#include "cuda/q8k_rule.cuh"
#include "cuda/round16_rule.cuh"

namespace frink::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kPer = kAttnMaxHeadDim / 32;  // head-dim elements per lane

// Keys per split: kAttnChunk (one tile) for decode-sized batches; for the prefill-sized
// batches that still take split-K (head dims above 128) kPrefillSplitTiles tiles, as the
// partial scratch grows with n_tok x splits (gemma's 256-wide heads at a 512-token batch).
constexpr int64_t kPrefillSplitTiles = 8;
__host__ __device__ int64_t split_keys(int64_t n_tok) {
  return n_tok < kAttnPrefillMinTok ? kAttnChunk : kAttnChunk * kPrefillSplitTiles;
}
__host__ __device__ int64_t n_split_for(int64_t n_keys, int64_t chunk) { return (n_keys + chunk - 1) / chunk; }

// Keys per decode tile: 16 or 32 for grids of at most kDecSmallTileSplits such tiles, else
// kAttnChunk. Why: at a short context a 64-key tile leaves a handful of blocks (8B: one per
// KV head and 64 keys), each copying 64 KB of K/V through one SM and walking 64 keys serially
// in scoring and P.V: 7.7 us per layer for at most 128 keys (ncu, H200, eighth session), the
// largest small kernel of a short-context token. 16-key tiles at a 512-key graph bound: 8B
// Q4_0 tg128 graph 2.305 / 2.304 -> 2.223 / 2.220 ms, qwen3-30b-a3b 3.013 -> 2.879 ms (H200,
// one call, alternating). The bound keeps the merge's walk short (at 16k keys its 258
// partials per head cost 30 us).
constexpr int64_t kDecSmallTileSplits = 32;
int64_t decode_tile_keys(int64_t max_keys) {
  for (int64_t tk = 16; tk < kAttnChunk; tk *= 2)
    if (max_keys <= kDecSmallTileSplits * tk) return tk;
  return kAttnChunk;
}

// The two-tile rule: 2 when even the shortest context a grid for max_keys serves (a token
// graph's bound is the next power of two of the length: at least max_keys / 2 keys) gives 4
// waves of one-tile blocks (blocks_per_split per split, `resident` blocks at once); such grids
// then take even splits of 32-key tiles (plan_splits). Why: at 16.5k keys (8B, 8 KV heads)
// the merge, one block per head over 258 partials, took 30 us of a layer's 110 us of
// attention (ncu, H200); 128-key splits halved its partials, and the token's graph went 5.48
// -> 5.03 ms. Shorter contexts keep 64-key splits, walked as two 32-key tiles.
int decode_split_tiles(int64_t max_keys, int64_t blocks_per_split, int64_t resident) {
  return resident > 0 && max_keys / 2 / kAttnChunk * blocks_per_split >= 4 * resident ? 2 : 1;
}

// The keys query t sees: [first, end), end = pos + 1; a window keeps the last `window` of
// them (llama.cpp's is_masked_swa, standard type, as the host).
struct KeyRange {
  int64_t pos, first, end;
};
__device__ __forceinline__ KeyRange key_range(const AttnParams& p, int64_t t) {
  const int64_t pos = *p.pos + t;
  return {pos, p.window > 0 ? max(int64_t{0}, pos - p.window + 1) : int64_t{0}, pos + 1};
}

// Keys per tile of the decode kernel's KS form, which walks even splits (plan_splits).
constexpr int kKsTileKeys = 32;

// Split s of n even splits (plan_splits): the tiles of tk keys that hold kr's keys, T of them
// from tile f, shared out as tiles [f + s T / n, f + (s + 1) T / n), returned as keys [lo, hi)
// (empty, lo == hi, where T < n). Decode kernel and merge both derive a split's keys from it.
struct EvenSplit {
  int64_t lo, hi;
};
__device__ __forceinline__ EvenSplit even_split(const KeyRange& kr, int64_t tk, int64_t n, int64_t s) {
  const int64_t f = kr.first / tk, n_t = (kr.end + tk - 1) / tk - f;
  return {(f + s * n_t / n) * tk, (f + (s + 1) * n_t / n) * tk};
}

// Q.K of key j for head h's query at pos -> its logit: scale, softcap, then the ALiBi bias
// (the host's order).
__device__ __forceinline__ float attn_logit(const AttnParams& p, float dot, int64_t h, int64_t pos, int64_t j) {
  float s = dot * p.scale;
  if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
  if (p.alibi_slopes) s -= p.alibi_slopes[h] * static_cast<float>(pos - j);
  return s;
}

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
// tensor-core kernel below does not take (fewer than kAttnMmaMinTok queries, head dims other
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

// 16 bytes global -> shared without a register round trip (cp.async, sm_80+), so a thread
// has all its loads of a tile in flight at once; a plain copy before sm_80.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<float4*>(smem) = *reinterpret_cast<const float4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Causal prefill on tensor cores (flash-attention 2's loop), in two launches:
// - kv16_kernel converts the K/V mirror rows the batch reads to f16 once, into the attention
//   scratch (AttnParams::partial): per KV head, tiles of kMmaKeys keys, each [key][D] and
//   contiguous, keys past the mirror's rows zero. Every query block of every head of a group
//   reads each tile (32 blocks at an 8B pp512), and the attention kernel converted it itself
//   until ncu showed the conversions to be most of its instructions.
// - attn_prefill_mma_kernel: grid (ceil(n_tok / kMmaRows), n_head), kMmaWarps warps; warp w
//   owns query rows t0 + 16 w .. + 15 and the block walks its keys in steps of kMmaStepKeys
//   aligned to multiples of it, double-buffered in shared memory by cp.async (the next
//   step's copies are in flight while the current step's products run). Q is converted once.
// S = Q K^T and O += P V are mma.sync m16n8k16 (f16 in, f32 accumulate); scale, softcap,
// ALiBi, masks (causal, window) and the online softmax act on the S fragments in f32 (log2
// units); P goes to f16 for the P V product straight from the S registers (an m16n8
// accumulator pair is an m16k16 A fragment). Fragment layouts (PTX ISA, mma.m16n8k16, g =
// lane / 4, q = lane % 4): A a0 (g, 2q..2q+1), a1 (g+8, 2q..), a2 (g, 2q+8..), a3 (g+8,
// 2q+8..); B b0 (k = 2q..2q+1, n = g), b1 (k = 2q+8.., n = g); C c0,c1 (g, 2q..2q+1), c2,c3
// (g+8, 2q..2q+1). K and V tiles are [key][d]: K's B fragments by ldmatrix, V's by
// ldmatrix.trans (b0 is then two consecutive keys of one d).
// f16 range: a tile (or Q) holding a value beyond kF16Safe is stored scaled by 2^-15 (a flag
// per KV head, tile and operand) and the product scaled back in f32 (P is then staged x 2^15,
// which stays below 65504), so values up to ~2e9 are safe; beyond that f16 gives inf.
constexpr int kMmaWarps = 4, kMmaRows = 16 * kMmaWarps, kMmaKeys = 64;
constexpr float kF16Safe = 60000.0f, kF16Down = 1.0f / 32768.0f, kF16Up = 32768.0f;

// Keys a block holds and steps over at once: kMmaKeys, or half a scratch tile at head dim 256,
// whose O accumulators (128 registers a thread) leave no room for a 64-key S tile and Q in
// registers. Q then stays in shared memory and is read by ldmatrix each step, and the block
// (101376 bytes) fits sm_86's opt-in limit and two a SM on the H200.
template <int D>
constexpr int kMmaStepKeys = D > 128 ? kMmaKeys / 2 : kMmaKeys;
template <int D>
struct MmaKV {
  // Two K/V tiles (the current one and the next in flight). Rows of D + 8 halves (4 mod 32
  // words): the 8 rows of an ldmatrix phase hit 32 banks.
  __half k[2][kMmaStepKeys<D>][D + 8];
  __half v[2][kMmaStepKeys<D>][D + 8];
};
// Up to head dim 128 Q is staged in k[1] (kMmaRows rows) and kept in registers.
template <int D>
struct MmaTile : MmaKV<D> {
  static_assert(kMmaRows == kMmaStepKeys<D>, "Q is staged in a K tile's buffer");
  __device__ __half (*q())[D + 8] { return this->k[1]; }
};
template <>
struct MmaTile<256> : MmaKV<256> {
  __half q_rows[kMmaRows][256 + 8];
  __device__ __half (*q())[256 + 8] { return q_rows; }
};

// The f16 copy in the scratch: per KV head, n_tiles tiles of K, then of V (kMmaKeys x D
// halves each), then a byte per KV head and tile: bit 0 K, bit 1 V stored x kF16Down.
__host__ __device__ inline int64_t kv16_tiles(int64_t max_keys) { return (max_keys + kMmaKeys - 1) / kMmaKeys; }
template <int D>
__device__ __forceinline__ __half* kv16_tile(const AttnParams& p, int64_t hk, int64_t tile, int which) {
  const int64_t nt = kv16_tiles(p.max_keys);
  return reinterpret_cast<__half*>(p.partial) + ((2 * hk + which) * nt + tile) * kMmaKeys * D;
}
template <int D>
__device__ __forceinline__ uint8_t* kv16_flags(const AttnParams& p) {
  return reinterpret_cast<uint8_t*>(kv16_tile<D>(p, p.n_head_kv, 0, 0));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower column/row index
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma_f16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // launch_attention takes this kernel on sm_80+ only
#endif
}

// B fragments of two m16n8k16 products at once: lane l gives the address of row l % 8 of 8x8
// matrix l / 8 (16 contiguous bytes, 16-byte aligned); r[i] is matrix i's fragment (the lane's
// row l / 4, columns 2 (l % 4), + 1), which is b0 / b1's layout; kTrans: matrix i transposed
// (rows 2 (l % 4), + 1 of column l / 4), the B fragment of a [k][n] tile stored k-major. One
// instruction where 32-bit loads took four (ncu: the kernel issued 2767 instructions a warp and
// tile, 128 of them mma).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  __trap();
#endif
}

// 2^x in one MUFU instruction (2 ulp; 2^-inf = 0). The prefill softmax works in log2 units
// (logits times log2 e): expf's range reduction took about 8 instructions a weight.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float abs_max4(float4 x) {
  return fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
}
__device__ __forceinline__ float4 mul4(float4 x, float s) { return make_float4(x.x * s, x.y * s, x.z * s, x.w * s); }
__device__ __forceinline__ void store_half4(__half* dst, float4 x) {  // dst 8-byte aligned
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_half2(x.x, x.y), pack_half2(x.z, x.w));
}

// kv16_kernel: grid (kv16_tiles(max_keys), n_head_kv), kKv16Threads; the tiles that hold
// keys of [first key of token 0, pos0 + n_tok) only. A thread loads its share of the tile's
// K and V (16 floats each at D 128) before the block decides each operand's scale.
constexpr int kKv16Threads = 256;
template <int D>
__global__ void __launch_bounds__(kKv16Threads) kv16_kernel(AttnParams p) {
  constexpr int kPer = kMmaKeys * D / 4 / kKv16Threads;  // float4 a thread and operand
  const int64_t tile = blockIdx.x, hk = blockIdx.y, j0 = tile * kMmaKeys;
  const int64_t first = key_range(p, 0).first, end = key_range(p, p.n_tok - 1).end;
  if (j0 + kMmaKeys <= first || j0 >= end) return;  // block-uniform
  const int64_t kw = p.n_head_kv * D;
  float4 kx[kPer], vx[kPer];
  float kmax = 0.0f, vmax = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int i = threadIdx.x + e * kKv16Threads, r = i / (D / 4), c = i % (D / 4);
    kx[e] = vx[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (j0 + r < end) {
      kx[e] = *reinterpret_cast<const float4*>(p.k + (j0 + r) * kw + hk * D + 4 * c);
      vx[e] = *reinterpret_cast<const float4*>(p.v + (j0 + r) * kw + hk * D + 4 * c);
    }
    kmax = fmaxf(kmax, abs_max4(kx[e]));
    vmax = fmaxf(vmax, abs_max4(vx[e]));
  }
  const bool kdown = __syncthreads_or(kmax > kF16Safe), vdown = __syncthreads_or(vmax > kF16Safe);
  __half* kd = kv16_tile<D>(p, hk, tile, 0);
  __half* vd = kv16_tile<D>(p, hk, tile, 1);
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int i = threadIdx.x + e * kKv16Threads;
    store_half4(kd + 4 * i, kdown ? mul4(kx[e], kF16Down) : kx[e]);
    store_half4(vd + 4 * i, vdown ? mul4(vx[e], kF16Down) : vx[e]);
  }
  if (threadIdx.x == 0) kv16_flags<D>(p)[hk * kv16_tiles(p.max_keys) + tile] = (kdown ? 1 : 0) | (vdown ? 2 : 0);
}

// Step `step` (keys kMmaStepKeys<D> x step ..) of KV head hk from the f16 copy into buffer b
// (cp.async; completed by cp_async_wait_all and a barrier).
template <int D>
__device__ __forceinline__ void issue_tile(MmaTile<D>& sm, int b, const AttnParams& p, int64_t hk, int64_t step) {
  constexpr int kSK = kMmaStepKeys<D>;
  const int64_t tile = step * kSK / kMmaKeys, row = step * kSK % kMmaKeys;
  const __half* ks = kv16_tile<D>(p, hk, tile, 0) + row * D;
  const __half* vs = kv16_tile<D>(p, hk, tile, 1) + row * D;
  for (int i = threadIdx.x; i < kSK * D / 8; i += kMmaWarps * 32) {
    const int r = i / (D / 8), c = i % (D / 8);
    cp_async16(&sm.k[b][r][8 * c], ks + 8 * i);
    cp_async16(&sm.v[b][r][8 * c], vs + 8 * i);
  }
}

template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) attn_prefill_mma_kernel(AttnParams p) {
  extern __shared__ float4 mma_smem_raw[];  // dynamic: over 48 KiB
  MmaTile<D>& sm = *reinterpret_cast<MmaTile<D>*>(mma_smem_raw);
  constexpr int kSK = kMmaStepKeys<D>;
  constexpr bool kQRegs = D <= 128;  // Q's A fragments in registers, else read from sm.q() each step
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q4 = lane % 4;
  const int64_t h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int n_rows = static_cast<int>(min(static_cast<int64_t>(kMmaRows), p.n_tok - t0));
  const int64_t block_first = key_range(p, t0).first, block_end = key_range(p, t0 + n_rows - 1).end;
  // This thread's rows of S and O: r = 0 (row g of the warp's 16) and r = 1 (row g + 8).
  // Rows past n_tok compute on zero queries and are never written.
  const int64_t trow[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
  const KeyRange kr[2] = {key_range(p, trow[0]), key_range(p, trow[1])};
  const float slope = p.alibi_slopes ? p.alibi_slopes[h] : 0.0f;
  const bool plain = slope == 0.0f && !(p.softcap > 0.0f);  // logits are q.k times the scale

  // Q (unscaled: p.scale is applied to the f32 product, so a small scale cannot push
  // queries into f16 subnormals) into A fragments for the D / 16 k-steps.
  uint32_t qa[kQRegs ? D / 16 : 2][4];
  float qmul = 1.0f;
  const int rw = warp * 16;
  const int64_t tile0 = block_first / kSK, tile_end = (block_end + kSK - 1) / kSK;  // steps of kSK keys
  const uint8_t* flags = kv16_flags<D>(p) + hk * kv16_tiles(p.max_keys);
  issue_tile<D>(sm, 0, p, hk, tile0);
  {
    const float* qsrc = p.q + t0 * p.q_stride + h * D;
    // Q times mul into sm.q() as f16; whether this thread saw a value beyond f16's safe range.
    // Q rows need not be 16-byte aligned (q_stride is the caller's): scalar loads.
    const auto stage_q = [&](float mul) {
      bool big = false;
      for (int i = threadIdx.x; i < kMmaRows * D / 4; i += kMmaWarps * 32) {
        const int r = i / (D / 4), c = i % (D / 4);
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n_rows) {
          const float* s = qsrc + r * p.q_stride + 4 * c;
          x = make_float4(s[0], s[1], s[2], s[3]);
        }
        big |= abs_max4(x) > kF16Safe;
        store_half4(&sm.q()[r][4 * c], mul4(x, mul));  // x * 1.0f is x exactly
      }
      return big;
    };
    if (__syncthreads_or(stage_q(1.0f))) {  // rare: restage Q scaled down (block-uniform)
      qmul = kF16Down;
      stage_q(kF16Down);
      __syncthreads();
    }
    if constexpr (kQRegs) {
#pragma unroll
      for (int s = 0; s < D / 16; ++s) {
        qa[s][0] = *reinterpret_cast<const uint32_t*>(&sm.q()[rw + g][16 * s + 2 * q4]);
        qa[s][1] = *reinterpret_cast<const uint32_t*>(&sm.q()[rw + g + 8][16 * s + 2 * q4]);
        qa[s][2] = *reinterpret_cast<const uint32_t*>(&sm.q()[rw + g][16 * s + 2 * q4 + 8]);
        qa[s][3] = *reinterpret_cast<const uint32_t*>(&sm.q()[rw + g + 8][16 * s + 2 * q4 + 8]);
      }
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's columns only

  for (int64_t tile = tile0; tile < tile_end; ++tile) {
    const int b = static_cast<int>((tile - tile0) % 2);
    const int64_t j0 = tile * kSK;
    const int fl = flags[j0 / kMmaKeys];
    cp_async_wait_all();
    __syncthreads();  // the tile landed; every warp is done with the other buffer's tile (and
                      // with Q's staging in it)
    if (tile + 1 < tile_end) issue_tile<D>(sm, b ^ 1, p, hk, tile + 1);  // in flight during this tile
    const float kmul = fl & 1 ? kF16Down : 1.0f, vmul = fl & 2 ? kF16Down : 1.0f;

    // S = Q K^T for this warp's 16 rows x kSK keys. Keys 8 n .. + 7, head dims 32 k2 .. + 31
    // as four 8x8 matrices: b0, b1 of k-steps 2 k2 and 2 k2 + 1. Each s[n] sums its k-steps in
    // order whichever loop is outside. Q from shared memory: k-steps outside, so each of Q's
    // fragments is read once a step (ldmatrix, the layout of qa's loads above); Q in
    // registers: keys outside, the order measured before head dim 256 came.
    float s[kSK / 8][4];
#pragma unroll
    for (int n = 0; n < kSK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    const auto k_step_pair = [&](int n, int k2, const uint32_t a0[4], const uint32_t a1[4]) {
      uint32_t kb[4];
      ldmatrix_x4<false>(kb, &sm.k[b][8 * n + lane % 8][32 * k2 + 8 * (lane / 8)]);
      mma_f16_16816(s[n], a0, kb[0], kb[1]);
      mma_f16_16816(s[n], a1, kb[2], kb[3]);
    };
    if constexpr (kQRegs) {
#pragma unroll
      for (int n = 0; n < kSK / 8; ++n)
#pragma unroll
        for (int k2 = 0; k2 < D / 32; ++k2) k_step_pair(n, k2, qa[2 * k2], qa[2 * k2 + 1]);
    } else {
#pragma unroll
      for (int k2 = 0; k2 < D / 32; ++k2) {
        const int qr = rw + 8 * ((lane / 8) % 2) + lane % 8;
        ldmatrix_x4<false>(qa[0], &sm.q()[qr][32 * k2 + 8 * (lane / 16)]);
        ldmatrix_x4<false>(qa[1], &sm.q()[qr][32 * k2 + 16 + 8 * (lane / 16)]);
#pragma unroll
        for (int n = 0; n < kSK / 8; ++n) k_step_pair(n, k2, qa[0], qa[1]);
      }
    }
    // Logits as attn_logit has them (scale, softcap, ALiBi), masked to each row's keys, then
    // times log2 e (the softmax below is in powers of 2); the tile's max per row (over the quad
    // that shares the row). A tile inside every row's keys of the warp, without softcap or
    // ALiBi (the common case), is one multiply a logit.
    const float sfac = p.scale / (qmul * kmul);  // powers of two: exact
    // Row r sees tile columns [lo, hi); its ALiBi distance to column col is dpos - col (exact
    // in f32 below 2^24, as the reference's float(pos - j)).
    int lo[2], hi[2];
    float dpos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lo[r] = static_cast<int>(min(max(kr[r].first - j0, int64_t{0}), static_cast<int64_t>(kSK)));
      hi[r] = static_cast<int>(min(max(kr[r].end - j0, int64_t{0}), static_cast<int64_t>(kSK)));
      dpos[r] = static_cast<float>(kr[r].pos - j0);
    }
    float mt[2] = {-INFINITY, -INFINITY};
    const bool whole = lo[0] == 0 && lo[1] == 0 && hi[0] == kSK && hi[1] == kSK;
    if (__all_sync(0xffffffffu, whole) && plain) {
      const float f = sfac * kLog2e;
#pragma unroll
      for (int n = 0; n < kSK / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= f;
          mt[e / 2] = fmaxf(mt[e / 2], s[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < kSK / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, col = 8 * n + 2 * q4 + (e % 2);
          float x = s[n][e] * sfac;
          if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
          x -= slope * (dpos[r] - static_cast<float>(col));  // slope 0 without ALiBi
          x = col >= lo[r] && col < hi[r] ? x * kLog2e : -INFINITY;
          s[n][e] = x;
          mt[r] = fmaxf(mt[r], x);
        }
    }
    float corr[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
      const float mn = fmaxf(m[r], mt[r]);
      mu[r] = mn == -INFINITY ? 0.0f : mn;  // a row with no key yet: keep exp() away from NaN
      corr[r] = ex2(m[r] - mu[r]);
      m[r] = mn;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kSK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = ex2(s[n][e] - mu[e / 2]);
        rs[e / 2] += s[n][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rs[r];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    // O += P V: the S accumulators of key blocks 2 kk and 2 kk + 1 are P's A fragment for
    // k-step kk. P is in [0, 1]; x 2^15 when V was scaled down.
    const float ps = vmul == 1.0f ? 1.0f : kF16Up;
#pragma unroll
    for (int kk = 0; kk < kSK / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_half2(s[2 * kk][0] * ps, s[2 * kk][1] * ps);
      pa[1] = pack_half2(s[2 * kk][2] * ps, s[2 * kk][3] * ps);
      pa[2] = pack_half2(s[2 * kk + 1][0] * ps, s[2 * kk + 1][1] * ps);
      pa[3] = pack_half2(s[2 * kk + 1][2] * ps, s[2 * kk + 1][3] * ps);
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {  // keys 16 kk .. + 15, head dims 8 n .. + 15: b0, b1 of n, n + 1
        uint32_t vb[4];
        ldmatrix_x4<true>(vb, &sm.v[b][16 * kk + 8 * ((lane / 8) % 2) + lane % 8][8 * (n + lane / 16)]);
        mma_f16_16816(o[n], pa, vb[0], vb[1]);
        mma_f16_16816(o[n + 1], pa, vb[2], vb[3]);
      }
    }
  }

  // Row sums over the quad; a sink is one more logit in the denominator, weighting no value.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (trow[r] >= p.n_tok) continue;
    float c = 1.0f, ll = l[r];
    if (p.sinks) {  // m is in log2 units
      const float sink = p.sinks[h] * kLog2e, mm = fmaxf(m[r], sink);
      c = ex2(m[r] - mm);
      ll = ll * c + ex2(sink - mm);
    }
    const float f = c / ll;
    float* out = p.out + trow[r] * p.n_head * D + h * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      out[8 * n + 2 * q4] = o[n][2 * r] * f;
      out[8 * n + 2 * q4 + 1] = o[n][2 * r + 1] * f;
    }
  }
}

// Split-K decode, grid (n_split, n_head / hb, n_tok), kDecThreads threads: one block is one
// split for hb query heads sharing a KV head (hb = the largest divisor of the group up to
// kDecMaxHeads, so the split's K/V bytes are read once per group). A decode split is one
// TK-key tile (TK = kAttnChunk, or 16/32 at short contexts: decode_tile_keys): every thread
// issues its 16-byte cp.async loads of K and V at once, so a block costs one memory round
// trip, and a long context gives thousands of blocks (the old kernel walked a 256-key split
// in 8 serial tiles of 4-byte loads: latency bound).
// Per tile: scores (TK 64: thread = key j, heads of j's set; TK 16/32: 8/4 consecutive lanes
// per key split its head dim and meet by shuffles), a softmax step per head (a warp per
// head: the tile's max, the running max, sum and correction in s_ml), and P.V (thread = 4
// columns of V for its heads, accumulators kept across tiles; the KS form: for every head and
// a set of the tile's keys, the sets meeting at the end). Prefill-sized batches and decode
// against long contexts take `tiles` tiles per split, or (the KS form) a share of the token's
// tiles (even_split; tiles is 0) (plan_splits). Writes the partials
// (m, l, acc) that attn_merge_kernel combines, in f32 throughout (the host's arithmetic up to
// summation order).
constexpr int kDecThreads = 128, kDecMaxHeads = 8;
constexpr int kDecSets = kDecThreads / static_cast<int>(kAttnChunk);  // threads per key in 64-key scoring
constexpr int kDecHeadsPerThread = kDecMaxHeads / kDecSets;  // heads per thread in 64-key scoring
static_assert(kDecThreads % kAttnChunk == 0 && kAttnChunk == 64, "scoring maps threads onto the split's keys");
// Score rows of TK + 1 floats: odd, so heads' rows lie in distinct banks.
__host__ __device__ constexpr int64_t dec_score_stride(int64_t tk) { return tk + 1; }

// Shared floats the decode kernel takes: K rows padded by 4 (a stride = 4 mod 32 words, so the
// 8 lanes of a 16-byte access phase read distinct banks), V rows, the queries, the scores, and
// (m, l, correction) per head.
// With key sets (KS) the K/V region also holds their P.V sums at the end (at most
// kDecThreads float4 a head).
__host__ __device__ constexpr int64_t dec_kv_floats(int64_t tk, int64_t hdk, int64_t hdv, int64_t hb, bool ks) {
  return ks && 4 * kDecThreads * hb > tk * (hdk + 4) + tk * hdv ? 4 * kDecThreads * hb : tk * (hdk + 4) + tk * hdv;
}
__host__ __device__ constexpr int64_t dec_smem_floats(int64_t tk, int64_t hdk, int64_t hdv, int64_t hb, bool ks) {
  return dec_kv_floats(tk, hdk, hdv, hb, ks) + hb * hdk + hb * dec_score_stride(tk) + 3 * hb;
}

// The KS kernel's 16-byte copies of TK mirror rows of n4 float4 each into shared memory:
// copy i = tid + kDecThreads n is row i / n4, column i % n4, walked from the thread's first
// copy rather than divided per copy. The divisions by a runtime n4 were most of the decode
// kernel's integer instructions (SASS, H200), and walking took the four-tile splits at depth
// 16384 from 3.909 to 3.755 ms (8B Q4_0 tg128 graph, H200, one call, two rounds). Exact for
// n4 <= kDecThreads.
struct RowCopy {
  int j0, c0, dj, dc, n4;
  __device__ explicit RowCopy(int n) : j0(static_cast<int>(threadIdx.x) / n), c0(static_cast<int>(threadIdx.x) % n),
                                       dj(kDecThreads / n), dc(kDecThreads % n), n4(n) {}
  // Rows key0 + j, j < TK, of g (row stride gstride floats) into s (row stride sstride); rows
  // outside [lo, hi) become zeros.
  template <int TK>
  __device__ void stage(float* s, int sstride, const float* g, int64_t gstride, int64_t key0, int64_t lo, int64_t hi) const {
    for (int j = j0, c = c0; j < TK;) {
      const int64_t key = key0 + j;
      float* dst = s + j * sstride + 4 * c;
      if (key >= lo && key < hi) cp_async16(dst, g + key * gstride + 4 * c);
      else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      j += dj;
      c += dc;
      if (c >= n4) {
        c -= n4;
        ++j;
      }
    }
  }
};

// RowCopy::stage's job with item i -> row i / n4, float4 column i % n4 (a division a copy):
// the head-set form's, which measured faster with it on the short plans (gpu-notes).
template <int TK>
__device__ __forceinline__ void stage_divided(float* s, int sstride, const float* g, int64_t gstride, int n4,
                                              int64_t key0, int64_t lo, int64_t hi) {
  for (int i = threadIdx.x; i < TK * n4; i += kDecThreads) {
    const int j = i / n4, c = i % n4;
    const int64_t key = key0 + j;
    float* dst = s + j * sstride + 4 * c;
    if (key >= lo && key < hi) cp_async16(dst, g + key * gstride + 4 * c);
    else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// HB: the most heads a block holds (hb <= HB), the bound of the per-head loops, which run
// predicated up to it: the KS kernel takes 4 where the group allows (Llama-3), else 8. HB 4
// took it from 72 to 60 registers and dropped 4 predicated-off heads a column from its scores:
// 8B Q4_0 tg128 graph at depth 16384 (even splits, H200, one call) 3.528 / 3.529 -> 3.407 ms.
template <int TK, bool KS, int HB = kDecMaxHeads>
__global__ void __launch_bounds__(kDecThreads) attn_decode_kernel(AttnParams p, int64_t n_split, int hb, int tiles) {
  static_assert(TK == 16 || TK == 32 || TK == kAttnChunk, "tile keys");
  constexpr int kStride = static_cast<int>(dec_score_stride(TK));
  extern __shared__ float4 dec_smem_raw[];  // float4: 16-byte aligned for cp.async
  dependent_kernel_start();  // the merge may launch now and wait (pdl.cuh)
  float* const smem = reinterpret_cast<float*>(dec_smem_raw);
  const int64_t split = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * hb, t = blockIdx.z;
  const int64_t hk = h0 / (p.n_head / p.n_head_kv);  // hb divides the group: one KV head
  const KeyRange kr = key_range(p, t);
  int64_t s_lo = split * TK * tiles;
  int64_t s_begin = max(s_lo, kr.first), s_end = min(kr.end, s_lo + TK * tiles);
  if constexpr (KS) {  // even splits (plan_splits): tiles is 0
    const EvenSplit es = even_split(kr, TK, n_split, split);
    s_lo = es.lo;
    s_begin = max(es.lo, kr.first);
    s_end = min(kr.end, es.hi);
  }
  if (s_begin >= s_end) return;  // block-uniform: a split outside this token's keys (the merge skips it)
  const int hdk = static_cast<int>(p.head_dim_k), hdv = static_cast<int>(p.head_dim_v);
  const int ks = hdk + 4, kc = hdk / 4, vc = hdv / 4;
  float* const sk = smem;
  float* const sv = sk + TK * ks;
  // The head-set form keeps its own expression for the same offset: written as the KS one,
  // ptxas gave those kernels 72 registers instead of 124, and they ran slower (gpu-notes).
  float* const sq = KS ? smem + dec_kv_floats(TK, hdk, hdv, hb, KS) : sv + TK * hdv;
  float* const ss = sq + hb * hdk;
  float* const s_ml = ss + hb * kStride;  // per head: running max, running sum, this tile's correction
  const int64_t kw = p.n_head_kv * p.head_dim_k, vw = p.n_head_kv * p.head_dim_v;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  {
    // The queries by cp.async where aligned, so that their round trip overlaps the first
    // tile's K/V copies (the first tile's wait and barrier complete both), where the plain
    // loads cost a round trip of their own: 8B Q4_0 tg128 graph 2.343 / 2.336 / 2.341 ->
    // 2.328 / 2.326 / 2.328 ms (H200, one call, alternating).
    const float* qh = p.q + t * p.q_stride + h0 * p.head_dim_k;  // hb heads, consecutive
    if (reinterpret_cast<uintptr_t>(qh) % 16 == 0)  // hdk % 4 == 0 (the kernel's condition)
      for (int i = 4 * tid; i < hb * hdk; i += 4 * kDecThreads) cp_async16(sq + i, qh + i);
    else
      for (int i = tid; i < hb * hdk; i += kDecThreads) sq[i] = qh[i];
  }
  if (tid < hb) {
    s_ml[3 * tid] = -INFINITY;
    s_ml[3 * tid + 1] = 0.0f;
  }
  // P.V work. Head sets: item tid -> column c (4 floats of V) and a head set; heads set,
  // set + sets, ... (at most kDecHeadsPerThread: sets >= min(hb, 2) as vc <= 64); vc * sets <=
  // kDecThreads, so a thread has at most one item, and its accumulators live across the tiles.
  // KS (key sets): item tid -> column c and key set tid / vc (keys j = set mod sets) for every
  // head, so each V float4 is read from shared memory once, not once per head set; the key
  // sets' sums meet in shared memory after the last tile. 8B Q4_0 tg64 graph at depth 16384
  // (then 64-key tiles) 4.211 -> 3.937 ms (H200, one call); the even splits of long contexts
  // take it. On the shorter plans it measured slower (depth 4096: 2.49 against 2.40
  // ms, one call), so they keep head sets and the divided copies, as measured before.
  const int sets = KS ? kDecThreads / vc : min(hb, max(1, kDecThreads / vc));
  const bool pv_item = tid < vc * sets;
  const int pv_c = tid % vc, pv_set = tid / vc;
  constexpr int kAcc = KS ? HB : kDecHeadsPerThread;
  float4 acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  const RowCopy kcopy(kc), vcopy(vc);  // KS only
  for (int64_t c0 = s_lo + (s_begin - s_lo) / TK * TK; c0 < s_end; c0 += TK) {
    const int64_t begin = max(c0, s_begin), end = min(s_end, c0 + TK);  // not empty
    __syncthreads();  // the previous tile's readers are done (and sq, s_ml are written)
    // Rows outside [begin, end) are zeros: never read from global memory (they may lie past
    // the mirror's rows), their scores are masked and zero V rows add nothing.
    if constexpr (KS) {
      kcopy.stage<TK>(sk, ks, p.k + hk * p.head_dim_k, kw, c0, s_begin, s_end);
      vcopy.stage<TK>(sv, hdv, p.v + hk * p.head_dim_v, vw, c0, s_begin, s_end);
    } else {
      stage_divided<TK>(sk, ks, p.k + hk * p.head_dim_k, kw, kc, c0, begin, end);
      stage_divided<TK>(sv, hdv, p.v + hk * p.head_dim_v, vw, vc, c0, begin, end);
    }
    cp_async_wait_all();
    __syncthreads();

    // Scores. TK 64: thread -> key j, heads set, set + kDecSets, ... (K float4 read once for
    // them all; the queries are broadcasts). TK 16/32: kP consecutive lanes per key, lane
    // part taking float4 columns part, part + kP, ... for every head, summed by shuffles;
    // lane part writes the heads hh with hh % kP == part.
    if constexpr (TK == kAttnChunk) {
      const int j = tid % kAttnChunk, set = tid / kAttnChunk;
      float dot[kDecHeadsPerThread] = {};
      const float4* k4 = reinterpret_cast<const float4*>(sk + j * ks);
      for (int c = 0; c < kc; ++c) {
        const float4 kv = k4[c];
#pragma unroll
        for (int i = 0; i < kDecHeadsPerThread; ++i) {
          const int hh = set + kDecSets * i;
          if (hh < hb) {
            const float4 qv = reinterpret_cast<const float4*>(sq + hh * hdk)[c];
            dot[i] += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
          }
        }
      }
      const int64_t key = c0 + j;
      const bool in = key >= begin && key < end;
#pragma unroll
      for (int i = 0; i < kDecHeadsPerThread; ++i) {
        const int hh = set + kDecSets * i;
        if (hh < hb) ss[hh * kStride + j] = in ? attn_logit(p, dot[i], h0 + hh, kr.pos, key) : -INFINITY;
      }
    } else {
      constexpr int kP = kDecThreads / TK;  // 4 or 8: within a warp
      const int j = tid / kP, part = tid % kP;
      float dot[HB] = {};
      const float4* k4 = reinterpret_cast<const float4*>(sk + j * ks);
      for (int c = part; c < kc; c += kP) {
        const float4 kv = k4[c];
#pragma unroll
        for (int hh = 0; hh < HB; ++hh) {
          if (hh < hb) {
            const float4 qv = reinterpret_cast<const float4*>(sq + hh * hdk)[c];
            dot[hh] += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < HB; ++hh)
#pragma unroll
        for (int o = kP / 2; o > 0; o >>= 1) dot[hh] += __shfl_xor_sync(0xffffffffu, dot[hh], o);
      const int64_t key = c0 + j;
      const bool in = key >= begin && key < end;
#pragma unroll
      for (int hh = 0; hh < HB; ++hh)
        if (hh < hb && hh % kP == part) ss[hh * kStride + j] = in ? attn_logit(p, dot[hh], h0 + hh, kr.pos, key) : -INFINITY;
    }
    __syncthreads();

    // Softmax step per head: warp w takes heads w, w + 4, ...; the weights exp(s - m) replace
    // the scores. m is finite: the tile has a key in range; the first tile's correction
    // exp(-inf) is 0 (on zero accumulators).
    for (int hh = warp; hh < hb; hh += kDecThreads / 32) {
      float* row = ss + hh * kStride;
      const float a = lane < TK ? row[lane] : -INFINITY, b = lane + 32 < TK ? row[lane + 32] : -INFINITY;
      float m = fmaxf(a, b);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float m_old = s_ml[3 * hh], m_new = fmaxf(m_old, m);
      const float ea = expf(a - m_new), eb = expf(b - m_new);
      if (lane < TK) row[lane] = ea;
      if (lane + 32 < TK) row[lane + 32] = eb;
      float l = ea + eb;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
      __syncwarp();  // every lane has read s_ml[3 hh] before lane 0 rewrites it
      if (lane == 0) {
        const float corr = expf(m_old - m_new);
        s_ml[3 * hh] = m_new;
        s_ml[3 * hh + 1] = s_ml[3 * hh + 1] * corr + l;
        s_ml[3 * hh + 2] = corr;
      }
    }
    __syncthreads();

    // P.V over the tile's keys in range: a key-set item takes every head and its set's keys,
    // a head-set item its set's heads and every key.
    if (pv_item) {
      const int jb = static_cast<int>(begin - c0), je = static_cast<int>(end - c0);
      const auto head = [&](int i) { return KS ? i : pv_set + sets * i; };
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int hh = head(i);
        if (hh < hb) {
          const float corr = s_ml[3 * hh + 2];
          acc[i] = make_float4(acc[i].x * corr, acc[i].y * corr, acc[i].z * corr, acc[i].w * corr);
        }
      }
      for (int j = KS ? jb + ((pv_set - jb % sets) + sets) % sets : jb; j < je; j += KS ? sets : 1) {
        const float4 vv = reinterpret_cast<const float4*>(sv + j * hdv)[pv_c];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          const int hh = head(i);
          if (hh < hb) {
            const float e = ss[hh * kStride + j];
            acc[i].x += e * vv.x;
            acc[i].y += e * vv.y;
            acc[i].z += e * vv.z;
            acc[i].w += e * vv.w;
          }
        }
      }
    }
  }

  const int64_t pstride = 2 + p.head_dim_v;
  if (tid < hb) {  // s_ml is final: the last tile's barrier came after its softmax step
    float* out = p.partial + ((t * p.n_head + h0 + tid) * n_split + split) * pstride;
    out[0] = s_ml[3 * tid];
    out[1] = s_ml[3 * tid + 1];
  }
  if constexpr (KS) {
    __syncthreads();  // every P.V is done: the K/V region takes the key sets' sums
    float4* const red = reinterpret_cast<float4*>(smem);  // [key set][head][column]
    if (pv_item)
#pragma unroll
      for (int hh = 0; hh < HB; ++hh)
        if (hh < hb) red[(pv_set * hb + hh) * vc + pv_c] = acc[hh];
    __syncthreads();
    for (int i = tid; i < hb * vc; i += kDecThreads) {
      float4 a = red[i];
      for (int k = 1; k < sets; ++k) {
        const float4 b = red[k * hb * vc + i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
      }
      float* out = p.partial + ((t * p.n_head + h0 + i / vc) * n_split + split) * pstride + 2 + 4 * (i % vc);
      out[0] = a.x;
      out[1] = a.y;
      out[2] = a.z;
      out[3] = a.w;
    }
  } else if (pv_item) {
#pragma unroll
    for (int i = 0; i < kDecHeadsPerThread; ++i) {
      const int hh = pv_set + sets * i;
      if (hh < hb) {
        float* out = p.partial + ((t * p.n_head + h0 + hh) * n_split + split) * pstride + 2 + 4 * pv_c;
        out[0] = acc[i].x;
        out[1] = acc[i].y;
        out[2] = acc[i].z;
        out[3] = acc[i].w;
      }
    }
  }
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
