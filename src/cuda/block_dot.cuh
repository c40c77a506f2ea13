// The decode products' block arithmetic on rows staged in shared memory (or read in place):
// the staged chunk geometry per type, and blocks_dot / LaneDot, the host's vec_dot_*_q8_*
// integer dots, as the stream kernel (matvec.cu) runs them. Apart so a kernel that stages rows
// its own way can compute them the same way (the dropped fused expert kernel did, branch
// dropped/fused-experts). Only for .cu files.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/matmul_parts.cuh"

namespace frink::cuda::mm {

namespace {

__device__ __forceinline__ int ld_i32_a2(const uint8_t* p) {  // 2-byte aligned int load
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16));
}

// The staged kernels (v3 on): a warp copies its rows in chunks of whole blocks (a multiple of
// 16 bytes) into shared memory with 16-byte cp.async, the next chunk's copy running while the
// current one is computed, and the lanes run the block arithmetic (blocks_dot) on the copy.
// Rows must start 16-byte aligned (staged_ok); others take the direct kernel. kSWarps warps
// per block: four, so the 1024-row K/V products still fill 132 SMs.
constexpr int kSWarps = 4;

// Per type: kBlocks blocks of kBlockBytes bytes (kBlockElems elements) per staged chunk.
template <int T, int Blocks>
struct StagedGeom {
  static constexpr bool kPlain = T == kBF16 || T == kF16;
  static constexpr int kBlocks = Blocks;
  static constexpr int kBlockBytes = kPlain ? 2 : BlockGeom<kPlain ? kQ4_0 : T>::kBytes;
  static constexpr int kBlockElems = kPlain ? 1 : BlockGeom<kPlain ? kQ4_0 : T>::kElems;
  static constexpr int kChunk = kBlocks * kBlockBytes;
  static_assert(kChunk % 16 == 0, "chunks are copied 16 bytes at a time");
};
template <int T> struct Staged;
template <> struct Staged<kQ4_0> : StagedGeom<kQ4_0, 64> {};  // 1152 bytes
template <> struct Staged<kQ8_0> : StagedGeom<kQ8_0, 32> {};  // 1088 bytes
template <> struct Staged<kQ4_K> : StagedGeom<kQ4_K, 8> {};   // 1152 bytes
template <> struct Staged<kQ5_K> : StagedGeom<kQ5_K, 8> {};   // 1408 bytes
template <> struct Staged<kQ6_K> : StagedGeom<kQ6_K, 8> {};   // 1680 bytes
template <> struct Staged<kMXFP4> : StagedGeom<kMXFP4, 64> {};  // 1088 bytes
template <> struct Staged<kBF16> : StagedGeom<kBF16, 512> {}; // 1024 bytes
template <> struct Staged<kF16> : StagedGeom<kF16, 512> {};
// Q4_0 read a block pair per lane (blocks_dot's kQ4_0Pairs branch): a kernel variant, not a
// GGUF type, so an id no type has; Q4_0's geometry and activation.
constexpr int kQ4_0Pairs = 1000 + kQ4_0;
template <> struct Staged<kQ4_0Pairs> : StagedGeom<kQ4_0, 64> {};
// x8 rows are read in place (matvec_reg_kernel), never staged: their file type's geometry for
// the launch's arithmetic (blocks a row), the same bytes.
template <> struct Staged<kQ4_0X8> : StagedGeom<kQ4_0, 64> {};
template <> struct Staged<kQ8_0X8> : StagedGeom<kQ8_0, 32> {};
template <> struct Staged<kQ4_KX8> : StagedGeom<kQ4_K, 8> {};
template <> struct Staged<kQ5_KX8> : StagedGeom<kQ5_K, 8> {};
template <> struct Staged<kQ6_KX8> : StagedGeom<kQ6_K, 8> {};
template <> struct Staged<kMXFP4X16> : StagedGeom<kMXFP4, 64> {};

__device__ __forceinline__ float h2f_a2(const uint8_t* p) { return __half2float(__ushort_as_half(ld_u16(p))); }

// Q4_0, one lane per block pair (36 bytes, 4-byte aligned in the staged chunk, whose blocks
// start at an even index), one token: the kQ4_0Pairs kernel variant. A chunk holds at most 64
// blocks, so a lane has at most one pair: blocks b0 + 2 lane and b0 + 2 lane + 1 of nb.
// PairAct is that pair's activation (two Q8_0 blocks), loaded apart from the arithmetic so the
// stream kernel can load it before waiting for the weights.
struct PairAct {
  int4 q[4];   // block A's 32 bytes, then B's
  float da, db;
};

__device__ __forceinline__ PairAct pair_act(const StagedAct& x, int b0, int nb) {
  const int lane = threadIdx.x % 32;
  // Zeros only for lanes without a pair (whose values pairs_dot never reads): zero-initialized
  // up front, every lane spent 12 CS2R an item on them (SASS, fourteenth session).
  PairAct p;
  if (2 * lane < nb) {
    const int ib = b0 + 2 * lane;
    const bool two = 2 * lane + 1 < nb;  // always, for staged rows (a multiple of 8 blocks); kept exact anyway
    const int4* xp = reinterpret_cast<const int4*>(x.q8 + ib * 32);
    p.q[0] = xp[0];
    p.q[1] = xp[1];
    p.q[2] = two ? xp[2] : make_int4(0, 0, 0, 0);
    p.q[3] = two ? xp[3] : make_int4(0, 0, 0, 0);
    p.da = x.d8[ib];
    p.db = two ? x.d8[ib + 1] : 0.0f;
  } else {
    p = PairAct{};
  }
  return p;
}

// One Q4_0 block's integer dot: the sum over its 32 elements of q x, q the raw nibbles of its
// 4 qs words (low nibbles are elements 4i.., activation piece lo; high ones 16 + 4i.., piece
// hi), from `sum` (minus 8 x the activation's sum there: the offset of 8, taken off once).
__device__ __forceinline__ int q4_0_idot(const int (&q)[4], const int4& lo, const int4& hi, int sum) {
  const int l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = __dp4a(q[i] & 0x0F0F0F0F, l[i], sum);
    sum = __dp4a((q[i] >> 4) & 0x0F0F0F0F, h[i], sum);
  }
  return sum;
}

// One Q4_0 block's value against x's Q8_0 block (lo, hi; xs = 8 x its quants' sum, dx its
// scale), in ggml's vec_dot_q4_0_q8_0 order: one integer per block, scaled once by dw dx.
__device__ __forceinline__ float q4_0_value(const int (&q)[4], float dw, const int4& lo, const int4& hi, int xs, float dx) {
  return static_cast<float>(q4_0_idot(q, lo, hi, -xs)) * (dw * dx);
}

// sum plus the 16 signed bytes of v.
__device__ __forceinline__ int bytes_sum(const int4& v, int sum) {
  sum = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101, sum));
  return __dp4a(v.z, 0x01010101, __dp4a(v.w, 0x01010101, sum));
}

// The pair's dot with R rows at s + r * rs into acc[r]: nine 4-byte shared loads and four
// funnel shifts give both blocks' scales and quants, where kQ4_0's two-lanes-per-block branch
// of blocks_dot spends five 2-byte loads per lane and block (the 18-byte blocks are only 2-byte
// aligned) and loads each activation piece per lane pair. The same integer per block,
// converted and scaled once (ggml's vec_dot_q4_0_q8_0 order) where that branch adds two
// halves' products: equal up to f32 rounding.
template <int R>
__device__ __forceinline__ void pairs_dot(const uint8_t* s, int64_t rs, int nb, const PairAct& x, float (&acc)[R][1]) {
  const int j = threadIdx.x % 32;
  if (2 * j >= nb) return;
  const bool two = 2 * j + 1 < nb;
  // 8 x each block's activation sum: the offset of 8, taken off once.
  const int xsa = 8 * bytes_sum(x.q[1], bytes_sum(x.q[0], 0)), xsb = 8 * bytes_sum(x.q[3], bytes_sum(x.q[2], 0));
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // Words of bytes [36 j, 36 j + 36): block A = d at 0, qs at 2..17; block B = d at 18,
    // qs at 20..35. A lone last block's B words lie inside the stage (never used).
    const uint32_t* w = reinterpret_cast<const uint32_t*>(s + r * rs + 36 * j);
    uint32_t v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = w[i];
    const float da = __half2float(__ushort_as_half(static_cast<unsigned short>(v[0] & 0xFFFFu)));
    const float db = __half2float(__ushort_as_half(static_cast<unsigned short>(v[4] >> 16)));
    int qa[4], qb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      qa[i] = static_cast<int>(__funnelshift_r(v[i], v[i + 1], 16));
      qb[i] = static_cast<int>(v[5 + i]);
    }
    acc[r][0] += q4_0_value(qa, da, x.q[0], x.q[1], xsa, x.da);
    if (two) acc[r][0] += q4_0_value(qb, db, x.q[2], x.q[3], xsb, x.db);
  }
}

// Q8_0, one lane per block (a chunk's 32 blocks of 34 bytes: one each), one token: the stream
// kernel's Q8_0 dot (LaneDot below). Why: four lanes a block with 2-byte loads (the 34-byte
// blocks are only 2-byte aligned) spent five shared loads per lane, block and row, most in
// 2-way bank conflicts, and an activation load per lane and pass (4 a chunk); this way nine
// 4-byte loads per row and 3 activation loads a chunk: 8B Q8_0 tg128 graph 3.144-3.146 ->
// 2.804-2.813 ms (H200, one call, alternating). An even block starts 4-byte aligned
// (its quants then 2 bytes off: funnel shifts), an odd one 2 bytes past a word (its quants
// aligned). One integer per block, scaled once (ggml's vec_dot_q8_0_q8_0 order), where the
// four-lane branch of blocks_dot adds four scaled partials: equal up to f32 rounding.
struct Q8BlockAct {
  int4 q[2];  // the block's 32 activation bytes
  float d;
};

__device__ __forceinline__ Q8BlockAct q8_block_act(const StagedAct& x, int b0, int nb) {
  const int lane = threadIdx.x % 32;
  Q8BlockAct a;  // zeros only for lanes without a block (as pair_act)
  if (lane < nb) {
    const int4* xp = reinterpret_cast<const int4*>(x.q8 + (b0 + lane) * 32);
    a.q[0] = xp[0];
    a.q[1] = xp[1];
    a.d = x.d8[b0 + lane];
  } else {
    a = Q8BlockAct{};
  }
  return a;
}

template <int R>
__device__ __forceinline__ void q8_blocks_dot(const uint8_t* s, int64_t rs, int nb, const Q8BlockAct& x,
                                              float (&acc)[R][1]) {
  const int j = threadIdx.x % 32;
  if (j >= nb) return;
  const int odd = j & 1;
  // Block j's bytes [34 j, 34 j + 34) lie in the 9 words from byte 34 j - 2 odd (an even
  // block's last word reaches 2 bytes into the next block; the last even block is 30, inside
  // the chunk). Quant word m: bytes 2 + 4m.. of the block, i.e. words m, m + 1 shifted right by
  // 16 bits (even) or word m + 1 itself (odd: a shift of 32).
  const uint32_t sh = 16u + 16u * static_cast<uint32_t>(odd);
  const int xw[8] = {x.q[0].x, x.q[0].y, x.q[0].z, x.q[0].w, x.q[1].x, x.q[1].y, x.q[1].z, x.q[1].w};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(s + r * rs + 34 * j - 2 * odd);
    uint32_t v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = w[i];
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>((v[0] >> (sh - 16u)) & 0xFFFFu)));
    int sum = 0;
#pragma unroll
    for (int m = 0; m < 8; ++m) sum = __dp4a(static_cast<int>(__funnelshift_rc(v[m], v[m + 1], sh)), xw[m], sum);
    acc[r][0] += static_cast<float>(sum) * (d * x.d);
  }
}

// One-token dots whose lane activation is loaded apart from the arithmetic, so that the stream
// kernel loads it before waiting for the item's weights (its round trip overlapping theirs):
// Act, act(x, b0, nb) and dot<R>(s, rs, nb, act, acc). Others: kOn false (blocks_dot).
template <int T>
struct LaneDot {
  static constexpr bool kOn = false;
  struct Act {};
};
template <>
struct LaneDot<kQ4_0Pairs> {
  static constexpr bool kOn = true;
  using Act = PairAct;
  static __device__ __forceinline__ Act act(const StagedAct& x, int b0, int nb) { return pair_act(x, b0, nb); }
  template <int R>
  static __device__ __forceinline__ void dot(const uint8_t* s, int64_t rs, int nb, const Act& a, float (&acc)[R][1]) {
    pairs_dot<R>(s, rs, nb, a, acc);
  }
};
template <>
struct LaneDot<kQ8_0> {
  static_assert(Staged<kQ8_0>::kBlocks == 32, "a chunk's blocks are one a lane");
  static constexpr bool kOn = true;
  using Act = Q8BlockAct;
  static __device__ __forceinline__ Act act(const StagedAct& x, int b0, int nb) { return q8_block_act(x, b0, nb); }
  template <int R>
  static __device__ __forceinline__ void dot(const uint8_t* s, int64_t rs, int nb, const Act& a, float (&acc)[R][1]) {
    q8_blocks_dot<R>(s, rs, nb, a, acc);
  }
};

// Q4_K (and Q5_K) arithmetic per lane of a group: the lane takes group g of a super-block
// (qs bytes [32 g, 32 g + 32): the low nibbles are sub-block 2 g, the high ones 2 g + 1).
// q4k_half_dot: 16 of those bytes qv (plus Q5_K's fifth bits lb / hb, as 16 in a byte) dotted
// with the sub-blocks' activation pieces xlo / xhi into lo / hi.
__device__ __forceinline__ void q4k_half_dot(const int4& qv, const int4& lb, const int4& hb, const int4& xlo,
                                             const int4& xhi, int& lo, int& hi) {
  lo = __dp4a((qv.x & 0x0F0F0F0F) | lb.x, xlo.x, lo);
  hi = __dp4a(((qv.x >> 4) & 0x0F0F0F0F) | hb.x, xhi.x, hi);
  lo = __dp4a((qv.y & 0x0F0F0F0F) | lb.y, xlo.y, lo);
  hi = __dp4a(((qv.y >> 4) & 0x0F0F0F0F) | hb.y, xhi.y, hi);
  lo = __dp4a((qv.z & 0x0F0F0F0F) | lb.z, xlo.z, lo);
  hi = __dp4a(((qv.z >> 4) & 0x0F0F0F0F) | hb.z, xhi.z, hi);
  lo = __dp4a((qv.w & 0x0F0F0F0F) | lb.w, xlo.w, lo);
  hi = __dp4a(((qv.w >> 4) & 0x0F0F0F0F) | hb.w, xhi.w, hi);
}

// The super-block's contribution through group g: header hd (words: d | dmin, then scale
// bytes 0-3, 4-7, 8-11), the group's integer dots s_lo / s_hi, the activation's scale dx and
// its sums xs0 / xs1 over the two sub-blocks. Sub-block j < 4: scale = byte j & 63, min = byte
// 4 + j & 63; j >= 4: the low (scale) or high (min) nibble of byte 4 + j, over the top two bits
// of byte j - 4 (scale) or j (min). All eight of each as bytes of two words, then this lane's
// pair (2 g, 2 g + 1). The host's vec_dot_q4_K_q8_K terms: d dx sum(sc s) - dmin dx sum(m xs).
__device__ __forceinline__ float q4k_group_value(const uint4& hd, int g, int s_lo, int s_hi, float dx, int xs0, int xs1) {
  const uint32_t sc_w = g < 2 ? hd.y & 0x3F3F3F3Fu : (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
  const uint32_t m_w = g < 2 ? hd.z & 0x3F3F3F3Fu : ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
  const int sh = 16 * (g & 1);
  const int sc0 = (sc_w >> sh) & 0xFF, sc1 = (sc_w >> (sh + 8)) & 0xFF;
  const int m0 = (m_w >> sh) & 0xFF, m1 = (m_w >> (sh + 8)) & 0xFF;
  const float dw = __half2float(__ushort_as_half(static_cast<unsigned short>(hd.x & 0xFFFFu)));
  const float dminw = __half2float(__ushort_as_half(static_cast<unsigned short>(hd.x >> 16)));
  return (dx * dw) * static_cast<float>(sc0 * s_lo + sc1 * s_hi) - (dx * dminw) * static_cast<float>(m0 * xs0 + m1 * xs1);
}

// Q6_K arithmetic per lane (blocks_dot's Q6_K branch: 8 lanes a super-block, lane k taking
// half h = k / 4 and elements [l8, l8 + 8), l8 = 8 (k % 4), of each quarter j of that half).
// q6k_offset: 32 x the sum of the quarter's 8 activation bytes xv: the six-bit values' offset of
// 32, taken off the integer dot once (the same integer as subtracting it per byte).
__device__ __forceinline__ int q6k_offset(const int2& xv) {
  return 32 * __dp4a(xv.y, 0x01010101, __dp4a(xv.x, 0x01010101, 0));
}

// Quarter j's integer dot: the lane's 8 bytes of ql at l8 (ql0) and at 32 + l8 (ql1) and of qh
// at l8 (2 words each) give the six-bit values (low nibbles for j < 2, high ones after; qh's bit
// pair 2 j on top), dotted with xv, less xs32.
__device__ __forceinline__ int q6k_quarter_dot(const uint32_t (&ql0)[2], const uint32_t (&ql1)[2],
                                               const uint32_t (&qh)[2], int j, const int2& xv, int xs32) {
  int q[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t lo = j % 2 == 0 ? ql0[w] : ql1[w], hb = qh[w];
    const uint32_t nib = j < 2 ? lo & 0x0F0F0F0Fu : (lo >> 4) & 0x0F0F0F0Fu;
    const uint32_t top = j == 0 ? hb << 4 : j == 1 ? hb << 2 : j == 2 ? hb : hb >> 2;
    q[w] = static_cast<int>(nib | (top & 0x30303030u));
  }
  return __dp4a(q[1], xv.y, __dp4a(q[0], xv.x, -xs32));
}

// Signed scale byte b (0..7) of a half's 8 scales, sc its two words.
__device__ __forceinline__ int q6k_scale(const uint32_t (&sc)[2], int b) {
  return static_cast<int8_t>((sc[b / 4] >> (8 * (b % 4))) & 0xFFu);
}

// Blocks [b0, b0 + nb) of R rows whose bytes start at s + r * rs (shared memory for the
// staged kernel, the row itself for the direct one), into acc[r] (NT activation rows): the
// host's vec_dot_q4_0_q8_0 / q8_0_q8_0 / q4_K_q8_K / q6_K_q8_K arithmetic (integer dots per
// block or sub-block, then the float scales; Q4_K's min term from the activation's per-32
// sums). A lane loads its activation once for all R rows: v3 with R = 1 spent more load
// instructions on the activation than on the weights (Q4_0: 11 loads per 16 weights).
// kLanes: the lanes that share the rows (32, or a sub-warp of 8 or 16 aligned lanes: matvec.cu's
// narrow K-quant kernel), lane l of them taking the blocks the warp's lane l would.
template <int T, int NT, int R, int kLanes = 32>
__device__ __forceinline__ void blocks_dot(const Args& a, const StagedAct& x, const uint8_t* s, int64_t rs, int64_t b0,
                                           int nb, float (&acc)[R][NT]) {
  static_assert(kLanes == 32 || kLanes == 16 || kLanes == 8, "a warp or an aligned sub-warp");
  const int lane = threadIdx.x % kLanes;
  if constexpr (T == kQ4_0Pairs) {
    // Pairs for one token only (registers); one token takes LaneDot<kQ4_0Pairs> in the stream
    // kernel, the only kernel of this variant.
    static_assert(NT > 1, "one-token Q4_0 pairs go through LaneDot");
    blocks_dot<kQ4_0, NT, R, kLanes>(a, x, s, rs, b0, nb, acc);
  } else if constexpr (T == kQ4_0 || T == kQ8_0) {
    // Lanes per weight block: Q4_0 2 (bytes [8k, 8k + 8) of qs: elements 8k.. and 16 + 8k..),
    // Q8_0 4 (elements [8k, 8k + 8)). Activation pieces are 8-byte aligned: one int2 load each.
    constexpr int kLpb = T == kQ4_0 ? 2 : 4;
    constexpr int kBytes = BlockGeom<T>::kBytes;
    const int k = lane % kLpb;
    const int64_t n_blk = a.n_in / 32;
    for (int i = lane / kLpb; i < nb; i += kLanes / kLpb) {
      const int64_t ib = b0 + i;
      int2 u0[NT], u1[NT];
      float dx[NT];
      int xs8[NT];  // Q4_0: 8 x the sum of the lane's 16 activations (see below)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int2* u = reinterpret_cast<const int2*>(x.q8 + t * a.n_in + ib * 32);
        u0[t] = u[k];
        if constexpr (T == kQ4_0) {
          u1[t] = u[2 + k];
          xs8[t] = 8 * __dp4a(u1[t].y, 0x01010101, __dp4a(u1[t].x, 0x01010101,
                                                          __dp4a(u0[t].y, 0x01010101, __dp4a(u0[t].x, 0x01010101, 0))));
        }
        dx[t] = x.d8[t * n_blk + ib];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = s + r * rs + i * kBytes;
        const float dw = h2f_a2(b);
        const int v0 = ld_i32_a2(b + 2 + 8 * k), v1 = ld_i32_a2(b + 6 + 8 * k);
        if constexpr (T == kQ4_0) {
          // sum (q - 8) x = sum q x - 8 sum x, the same integer: the raw nibbles go to dp4a and
          // the offset comes once per block from xs8 (v3 subtracted it per byte with __vsub4,
          // which sm_90 emulates in several instructions, for every row).
          const int w0 = v0 & 0x0F0F0F0F, w1 = v1 & 0x0F0F0F0F;
          const int w2 = (v0 >> 4) & 0x0F0F0F0F, w3 = (v1 >> 4) & 0x0F0F0F0F;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            int sum = __dp4a(w0, u0[t].x, -xs8[t]);
            sum = __dp4a(w1, u0[t].y, sum);
            sum = __dp4a(w2, u1[t].x, sum);
            sum = __dp4a(w3, u1[t].y, sum);
            acc[r][t] += static_cast<float>(sum) * (dw * dx[t]);
          }
        } else {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const int sum = __dp4a(v1, u0[t].y, __dp4a(v0, u0[t].x, 0));
            acc[r][t] += static_cast<float>(sum) * (dw * dx[t]);
          }
        }
      }
    }
  } else if constexpr (T == kMXFP4) {
    // A lane a 17-byte block: its code book entries by register lookups (book16x8) into dp4a,
    // the host's vec_dot_mxfp4_q8_0, the integer dot times d_x * 2^(e - 128). Why not the float
    // kernel: gpt-oss-20b's expert products read the activation as 32 floats a block there. Why
    // a lane a block, not Q4_0's two: the kernel is issue bound (ncu: SM 65%, DRAM 28%), and
    // two lanes each loaded the activation's scale, the block's scale and their halves apart.
    constexpr int kBytes = BlockGeom<T>::kBytes;
    const int64_t n_blk = a.n_in / 32;
    for (int i = lane; i < nb; i += kLanes) {
      const int64_t ib = b0 + i;
      int4 u0[NT], u1[NT];
      float dx[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int4* u = reinterpret_cast<const int4*>(x.q8 + t * a.n_in + ib * 32);
        u0[t] = u[0];  // elements 0..15
        u1[t] = u[1];  // 16..31
        dx[t] = x.d8[t * n_blk + ib];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // The block's 17 bytes from the five aligned words that hold them: the scale byte, then
        // the quant words funnel-shifted (clamped: a shift of 32 is the next word whole).
        const uintptr_t ba = reinterpret_cast<uintptr_t>(s + r * rs + i * kBytes);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(ba & ~uintptr_t{3});
        const uint32_t o = static_cast<uint32_t>(ba & 3) * 8;
        uint32_t wd[5];
#pragma unroll
        for (int j = 0; j < 5; ++j) wd[j] = w[j];
        const float dw = e8m0_half((wd[0] >> o) & 0xFFu);
        int2 e[4];  // e[j]: elements 4j.. (.x, low nibbles) and 16 + 4j.. (.y, high nibbles)
#pragma unroll
        for (int j = 0; j < 4; ++j) e[j] = book16x8<Mxfp4Book>(__funnelshift_rc(wd[j], wd[j + 1], o + 8));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          int sum = __dp4a(e[0].x, u0[t].x, 0);
          sum = __dp4a(e[1].x, u0[t].y, sum);
          sum = __dp4a(e[2].x, u0[t].z, sum);
          sum = __dp4a(e[3].x, u0[t].w, sum);
          sum = __dp4a(e[0].y, u1[t].x, sum);
          sum = __dp4a(e[1].y, u1[t].y, sum);
          sum = __dp4a(e[2].y, u1[t].z, sum);
          sum = __dp4a(e[3].y, u1[t].w, sum);
          acc[r][t] += static_cast<float>(sum) * (dw * dx[t]);
        }
      }
    }
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    // Q5_K: Q4_K's header and nibbles (at 48, after 32 bytes of qh), each element's fifth bit
    // bit 2 g (low nibbles) or 2 g + 1 (high) of qh[l], l its index in the 32-element group.
    // Q4_K_M files quantize attn_qkv to Q5_K (qwen3-next's delta-net input: 8192 x 2048), which
    // took the generic float kernel at 30.8 us a launch (ncu); this way qwen3-next-80b-a3b
    // Q4_K_M, 4 layers, tg128 graph 0.462 -> 0.391 ms (H200, one call, alternating).
    // 4 lanes per 144-byte super-block; lane g takes qs group g (bytes [16 + 32 g, + 32): the
    // low nibbles are sub-block 2 g, the high ones 2 g + 1) in two 16-byte halves, and the
    // super-block's first 16 bytes (d, dmin, the 12 scale bytes) in one load, the two 6-bit
    // scales and mins taken out by word masks. Why: with 8 lanes a block (half a group each),
    // every lane decoded its two scales byte by byte (get_scale_min_k4's branch, divergent
    // within the warp) for 32 weights; ncu (8B Q4_K_M decode) read the gate/up product at 2.07
    // TB/s against Q4_0's 2.6 for the same bytes, the down at 1.71 against 2.16. This way: 8B Q4_K_M
    // tg128 graph 3.020 / 3.012 -> 2.677 / 2.679 ms (H200, one call, alternating).
    constexpr int kBytes = BlockGeom<T>::kBytes, kQs = T == kQ5_K ? 48 : 16;
    const int g = lane % 4;
    const int64_t n_sb = a.n_in / 256;
    for (int i = lane / 4; i < nb; i += kLanes / 4) {
      const int64_t ib = b0 + i;
      float dx[NT];
      int xs0[NT], xs1[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        dx[t] = x.q8k.d[t * n_sb + ib];
        const int32_t* xs = x.q8k.sum + t * (a.n_in / 32) + ib * 8 + 2 * g;  // 4-byte aligned only
        xs0[t] = xs[0];
        xs1[t] = xs[1];
      }
      int s_lo[R][NT], s_hi[R][NT];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) s_lo[r][t] = s_hi[r][t] = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // elements [16 h, 16 h + 16) of both sub-blocks
        int4 xlo[NT], xhi[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int8_t* xq = x.q8k.q + t * a.n_in + ib * 256 + 64 * g + 16 * h;
          xlo[t] = *reinterpret_cast<const int4*>(xq);
          xhi[t] = *reinterpret_cast<const int4*>(xq + 32);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int4 qv = *reinterpret_cast<const int4*>(s + r * rs + i * kBytes + kQs + 32 * g + 16 * h);
          int4 lb = make_int4(0, 0, 0, 0), hb = lb;  // Q5_K's fifth bits, as 16 in a byte
          if constexpr (T == kQ5_K) {
            const int4 qh = *reinterpret_cast<const int4*>(s + r * rs + i * kBytes + 16 + 16 * h);
            lb = make_int4(((qh.x >> (2 * g)) & 0x01010101) << 4, ((qh.y >> (2 * g)) & 0x01010101) << 4,
                           ((qh.z >> (2 * g)) & 0x01010101) << 4, ((qh.w >> (2 * g)) & 0x01010101) << 4);
            hb = make_int4(((qh.x >> (2 * g + 1)) & 0x01010101) << 4, ((qh.y >> (2 * g + 1)) & 0x01010101) << 4,
                           ((qh.z >> (2 * g + 1)) & 0x01010101) << 4, ((qh.w >> (2 * g + 1)) & 0x01010101) << 4);
          }
#pragma unroll
          for (int t = 0; t < NT; ++t) q4k_half_dot(qv, lb, hb, xlo[t], xhi[t], s_lo[r][t], s_hi[r][t]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 hd = *reinterpret_cast<const uint4*>(s + r * rs + i * kBytes);
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] += q4k_group_value(hd, g, s_lo[r][t], s_hi[r][t], dx[t], xs0[t], xs1[t]);
      }
    }
  } else if constexpr (T == kQ6_K) {
    // 8 lanes per 210-byte super-block, 4 blocks a warp pass; lane k takes half h = k / 4 and
    // elements l in [l8, l8 + 8), l8 = 8 (k % 4), of each quarter j (+0, +32, +64, +96) of that
    // half: 8 bytes of ql at l8 and at 32 + l8, 8 bytes of qh at l8; element e = 128 h + 32 j + l
    // lies in 16-element sub-block 8 h + 2 j + l8 / 16. Blocks start 2-byte aligned (210 bytes):
    // each 8-byte run is read as aligned 4-byte words shifted by 16 bits where the block starts
    // 2 bytes past a word. Why: 16 lanes a block with 2-byte loads spent 11 shared loads per
    // lane, block and row (44 a chunk and row); this way 13 a block, 26 a chunk. (The Q8_0 dot's
    // like change took the 8B Q8_0 token 3.145 -> 2.81 ms, H200.)
    const int k = lane % 8, h = k / 4, l8 = 8 * (k % 4), is = l8 / 16;
    const int64_t n_sb = a.n_in / 256;
    for (int i = lane / 8; i < nb; i += kLanes / 8) {
      const int64_t ib = b0 + i;
      uint32_t ql0[R][2], ql1[R][2], qh[R][2];  // ql at l8, ql at 32 + l8, qh at l8: words 0, 1
      int scj[R][4];
      float dw[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uintptr_t base = reinterpret_cast<uintptr_t>(s + r * rs + i * 210);
        const uint32_t* wd = reinterpret_cast<const uint32_t*>(base & ~uintptr_t{3});
        const uint32_t sh = static_cast<uint32_t>(base & 2u) * 8u;  // 0 or 16 bits
        // The 8 bytes at block offset o (a multiple of 4): a third word only when shifted (an
        // unshifted run never reads past its bytes: the last, at 200, ends at the scale d).
        const auto run8 = [&](int o, uint32_t(&v)[2]) {
          const uint32_t* p = wd + o / 4;
          const uint32_t w0 = p[0], w1 = p[1], w2 = sh ? p[2] : 0u;
          v[0] = __funnelshift_r(w0, w1, sh);
          v[1] = __funnelshift_r(w1, w2, sh);
        };
        uint32_t sc[2];
        run8(64 * h + l8, ql0[r]);
        run8(64 * h + 32 + l8, ql1[r]);
        run8(128 + 32 * h + l8, qh[r]);
        run8(192 + 8 * h, sc);  // the half's 8 scales
#pragma unroll
        for (int j = 0; j < 4; ++j) scj[r][j] = q6k_scale(sc, is + 2 * j);
        dw[r] = h2f_a2(reinterpret_cast<const uint8_t*>(base) + 208);
      }
      int sumi[R][NT];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) sumi[r][t] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int2 xv = *reinterpret_cast<const int2*>(x.q8k.q + t * a.n_in + ib * 256 + 128 * h + 32 * j + l8);
          const int xs32 = q6k_offset(xv);
#pragma unroll
          for (int r = 0; r < R; ++r) sumi[r][t] += scj[r][j] * q6k_quarter_dot(ql0[r], ql1[r], qh[r], j, xv, xs32);
        }
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float dx = x.q8k.d[t * n_sb + ib];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] += (dx * dw[r]) * static_cast<float>(sumi[r][t]);
      }
    }
  } else {
    static_assert(T != T, "F16 / BF16 rows are read in place (matvec.cu, matvec_reg_kernel)");
  }
}

}  // namespace

}  // namespace frink::cuda::mm
