// Causal prefill attention on tensor cores: the K/V tiles converted to f16 (kv16_kernel) and
// the flash-attention loop (attn_prefill_mma_kernel). Only for attention.cu (launch_attention).
#pragma once

#include <cuda_fp16.h>

#include "cuda/attention_parts.cuh"
#include "cuda/pdl.cuh"

namespace frink::cuda {

namespace {

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

}  // namespace

}  // namespace frink::cuda
