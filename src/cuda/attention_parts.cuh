// What the attention kernels share (attention.cu and the kernel files it includes; their
// anonymous namespace is its own): keys per split and tile, the keys a query sees, the logit
// (scale, softcap, ALiBi), and 16-byte copies to shared memory.
#pragma once

#include <cstdint>

#include "cuda/attention.cuh"

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

}  // namespace

}  // namespace frink::cuda
