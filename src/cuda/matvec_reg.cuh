// The register kernel: x8 layouts and F16 / BF16 rows read straight into registers, a warp a
// row pair (or a row). Only for matvec.cu (its launches: stream_launch).
#pragma once

#include <type_traits>

#include "cuda/block_dot.cuh"
#include "cuda/matvec_segs.cuh"
#include "cuda/q8_0_rule.cuh"

namespace frink::cuda::mm {

namespace {

// A weight load of matvec_reg_kernel: ld.global.nc.L1::no_allocate, so the streamed weights do
// not take L1 lines from the activation rows the warps of a SM share. Measured (H200, graph ms
// per decode token, one call, alternating __ldg -> no_allocate, two rounds): 8B BF16 4.431 /
// 4.436 -> 4.385 / 4.389, Q4_0 1.888 / 1.887 -> 1.869 / 1.872, Q4_K_M 2.288 / 2.291 -> 2.239 /
// 2.229, qwen3-30b-a3b Q4_0 2.434 / 2.541 -> 2.412 / 2.532. Q8_0 lost 4% with it (2.609 ->
// 2.723) while each block's 32 quant bytes lay together, so each of a lane's two loads touched
// every sector of its group's run; with its words in runs of their own (dequant.cuh) it gains
// or ties (2.612 / 2.612 against __ldg's 2.610 / 2.617).
template <class V>
__device__ __forceinline__ V ldw(const V* p) {
  if constexpr (sizeof(V) == 16) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return *reinterpret_cast<V*>(&v);
  } else if constexpr (sizeof(V) == 8) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return *reinterpret_cast<V*>(&v);
  } else if constexpr (sizeof(V) == 1) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return static_cast<V>(v);
  } else {
    static_assert(sizeof(V) == 2, "16-, 8-, 2- and 1-byte weight loads");
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return *reinterpret_cast<V*>(&v);
  }
}

// A folded norm's 1/rms (MatmulParams::fold_in, StagedAct::fold), in every lane: the
// producer's 32-row sums of x^2 added by the warp (a few L2 loads a lane, after the wait).
// matvec_reg_kernel's Q4_0 / Q8_0 dot scales each block's raw scale by it and rounds that to
// f16: the scale the host gives the normed row's block, so the quants and scales a product
// dots are the norm launch's (up to the rounding of 1/rms), not off by an f16 rounding (2^-11).
__device__ __forceinline__ float fold_rms_scale(const StagedAct& x) {
  float ss = 0.0f;
  for (int i = threadIdx.x % 32; i < x.fold.n / 32; i += 32) ss += x.fold.parts[i];
  return rsqrtf(warp_sum(ss) / static_cast<float>(x.fold.n) + x.fold.eps);
}

// MatmulParams::fold_out's store (a block's 32 warps are rows 32 blockIdx.x + warp: one Q8_0
// block): y as seg_store's plain path writes it, then warp 0 quantizes w * y with the host's
// Q8_0 rule and sums y^2 for the block. v: the warp's lane partials of its row; w: lane j's
// norm weight of row j (warp 0).
__device__ __forceinline__ void fold_store(const Segs& sg, const Args& first, int64_t row, float v, float w) {
  __shared__ float ys[32];
  const float sum = warp_sum(v) + 0.0f;
  const int lane = threadIdx.x % 32, wv = threadIdx.x / 32;
  if (lane == 0) {
    const float y = first.residual ? sum + first.residual[row] : sum;
    first.y[row] = y;
    ys[wv] = y;
  }
  __syncthreads();
  // The block's products are done: the fold's reader may launch and copy its first weights
  // while the fold is written and the blocks leave (its wait still covers the whole grid).
  // Measured (H200, 8B tg128 graph ms, 8 layers, one call, two rounds): Q4_0 0.541 / 0.540 ->
  // 0.538 / 0.537, Q8_0 0.754 / 0.752 -> 0.751 / 0.757; 32 layers Q4_0 1.876 -> 1.857, Q8_0
  // 2.573 -> 2.559. (Released after the last weight loads instead, as every product was
  // once, blocks launched early took the running product's SM slots: 4% lost.)
  grid_dependents_launch();
  if (wv != 0) return;
  const float y = ys[lane];
  const Q8Elem e = q8_0_warp_block(y * w, true);
  sg.fold.q[int64_t{blockIdx.x} * 32 + lane] = e.q;
  const float ss = warp_sum(y * y);
  if (lane == 0) {
    sg.fold.d()[blockIdx.x] = e.d;
    sg.fold.parts[blockIdx.x] = ss;
  }
}

// The types matvec_reg_kernel reads (the stream launch's kReg), at compile time and run time.
constexpr bool reg_kernel_type(int type) { return is_x8(type) || type == kF16 || type == kBF16; }

// Blocks (F16 / BF16: groups of 8 elements) a lane loads per row and pass, by default
// (matvec_reg_kernel's KB).
template <int T> constexpr int RegBlocks = T == kQ4_0X8 || T == kMXFP4X16 || Staged<T>::kPlain ? 2 : 1;
// The one-token launch bound (matvec_reg_kernel's MinB), blocks a SM: 8 (63 registers), but
// MXFP4X16, whose code book lookups spilled 32 bytes at 64 registers: 6 (80, none). Measured
// (H200, gpt-oss-20b MXFP4 8 layers, tg128 graph ms, one call, two rounds; KB, MinB): 2, 8 0.708
// / 0.708; 2, 6 0.706 / 0.707; 3, 8 (one pass for 2880-wide rows; 68 bytes spilled) 0.730 /
// 0.731; 3, 6 0.710 / 0.709; 3, 5 0.710 / 0.710.
template <int T> constexpr int RegMinBlocks = T == kMXFP4X16 ? 6 : 8;

// Q4_0, Q8_0, Q4_K, Q6_K and MXFP4 in the x8 layouts (matmul.cuh, x8_type), and F16 / BF16 rows, decode
// batches of NT tokens and expert slots: one warp per row pair (or per row: OneRow) of the
// launch's products (Segs, the stream kernel's index space and store), read straight into
// registers. Lane j takes blocks j, j + 32, ...: a block's
// quants are one (Q4_0) or two (Q8_0) 16-byte loads and its scale one 2-byte load, and the lanes' loads are
// coalesced (8 lanes read a group's 128 bytes of quants). The stream kernel staged the same
// bytes through shared memory (cp.async, a 2-byte aligned layout) and spent most of its
// instructions on that staging and its bookkeeping, not on the dot: ~420 warp-instructions a
// 2304-byte item against ~160 for the arithmetic (SASS, fourteenth session), issue-bound at
// ~470 G a second (docs/gpu-notes.md). Here no staging, cursors or pipeline waits.
// KB: blocks a lane loads per row and pass; MinB: the launch bound, blocks a SM (one token:
// 8, 63 registers without spilling; four tokens take 96). Measured (H200, graph ms per
// decode token, one call, alternating; tg128 in brackets): 8B Q4_0 as the stream kernel 2.041 /
// 2.038 (466.5 / 473.2), KB 2 1.920 / 1.918 (499.7 / 502.1), KB 4 without a bound (88
// registers) 1.983 / 1.984, KB 1 1.973 / 1.969; qwen3-30b-a3b Q4_0, 8 layers, 0.463 / 0.464,
// 0.425 / 0.426, 0.461 / 0.460, 0.434 / 0.436. Q8_0 (KB 1, 59 registers; KB 2 spilled at the
// bound): 8B graph 2.836 / 2.832 -> 2.656 / 2.656 (tg128 341.5 / 344.4 -> 365.3 / 364.0), KB 2
// 2.990 / 2.983. In ncu (4 layers, caches flushed) the 8B gate/up
// reads at the stream kernel's rate (22.5 against 22.6 us, about a bare read of its 66 MB)
// with three quarters of its instructions, and wo and the down average 10.6 us against the
// stream kernel's 8.1 and 15.0 (KB 1 with two passes in flight, below).
// W: warps a block; kRegRopeWarps (with Rope, one token, MinB 4) is the neox RoPE launch
// (neox_rows, neox_store): its own instantiation, since the branch in the adjacent-pair kernels
// cost them registers (Q4_K spilled 16 bytes).
// T2: the type of the launch's products from sg.t2_seg on (two_type_launch), T for all by default.
// Fold: the product writes MatmulParams::fold_out too (fold_store; one token, OneRow, W 32).
template <int T, int NT, bool Rope, int KB = RegBlocks<T>, int MinB = NT == 1 ? RegMinBlocks<T> : 0,
          bool OneRow = false, int W = kSWarps, int T2 = T, bool Fold = false>
__global__ void __launch_bounds__(W * 32, MinB) matvec_reg_kernel(Segs sg, StagedAct x) {
  constexpr bool kNeox = Rope && NT == 1 && W == kRegRopeWarps;
  static_assert(kIsX8<T> || Staged<T>::kPlain, "x8 layouts and F16 / BF16 rows only");
  static_assert(T2 == T || (NT == 1 && !OneRow && two_type_launch(T, T2)), "a second type: one token, K-quant tiles");
  // OneRow: a warp per row (warps 2 g and 2 g + 1 share row pair g), without RoPE.
  static_assert(!OneRow || (!Rope && (T == kQ4_0X8 || T == kQ8_0X8 || Staged<T>::kPlain)), "one row a warp: plain stores");
  static_assert(!Fold || (NT == 1 && OneRow && W == 32 && (T == kQ4_0X8 || T == kQ8_0X8)), "a fold: 32 rows a block");
  // The norm's weight of row (block's 32) lane, for warp 0's fold: no kernel's output, read early.
  [[maybe_unused]] float fold_w = 0.0f;
  if constexpr (Fold)
    if (threadIdx.x < 32) fold_w = sg.fold.w[int64_t{blockIdx.x} * 32 + threadIdx.x];
  Args first = sg.a[0];
  const int64_t slot_e = block_slot_expert<0>(sg, first);  // (as in the stream kernel)
  {
    const int64_t xr = select_slot(first);
    if constexpr (Staged<T>::kPlain) {
      x.x += xr * first.x_stride;
    } else if constexpr (dp4a_act_for(T) == kActDp4aK) {
      x.q8k = x.q8k.at_row(xr, first.n_in);
    } else {
      x.q8 += xr * first.n_in;
      x.d8 += xr * (first.n_in / 32);
    }
  }
  const int lane = threadIdx.x % 32;
  const int64_t wi = int64_t{blockIdx.x} * W + threadIdx.x / 32;
  const int64_t g = OneRow ? wi / 2 : wi;
  const int rsel = OneRow ? static_cast<int>(wi % 2) : 0;
  if (g >= sg.g_end[sg.n - 1]) return;  // warp-uniform; no barrier below
  int seg = 0;
  while (g >= sg.g_end[seg]) ++seg;
  const int64_t row0 = (g - (seg > 0 ? sg.g_end[seg - 1] : 0)) * kSRows;
  // (Fields by value, as the stream kernel's row_starts: a reference would put `first` in local memory.)
  const uint8_t* const w = seg == 0 ? first.w : sg.a[seg].w + slot_e * sg.a[seg].expert_bytes;
  const size_t row_bytes = seg == 0 ? first.row_bytes : sg.a[seg].row_bytes;
  const int64_t n_out = seg == 0 ? first.n_out : sg.a[seg].n_out;
  static_assert(kSRows == 2, "rows[1] below");
  if (OneRow && row0 + rsel >= n_out) return;
  const uint8_t* rows[kSRows];
  rows[0] = w + (row0 + rsel) * row_bytes;
  rows[1] = row0 + 1 < n_out ? rows[0] + row_bytes : rows[0];  // a product's odd last row: computed twice, stored once
  [[maybe_unused]] int64_t r0 = row0, r1 = row0 + 1 < n_out ? row0 + 1 : row0;  // neox_store's rows
  if constexpr (kNeox) {
    neox_rows(sg.rope, seg, row0 / 2, r0, r1);
    rows[0] = w + r0 * row_bytes;
    rows[1] = w + r1 * row_bytes;
  }
  float acc[kSRows][NT];
#pragma unroll
  for (int r = 0; r < kSRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  // The rows' dot as type U: T, or T2 for the products from sg.t2_seg on.
  const auto dot = [&](auto type) {
    constexpr int U = decltype(type)::value;
    if constexpr (U == kQ4_KX8 || U == kQ5_KX8) {
      // Lane j takes super-block j / 4 of each tile (8 super-blocks, 2048 elements) and group
      // j % 4 in it, as blocks_dot's Q4_K branch does (4 lanes a super-block, the same sums in
      // the same order); the tile's layout (dequant.cuh) makes its header loads one 128-byte run
      // and each half of its quants 512 contiguous bytes. KB tiles a pass, added in tile order.
      // Q5_K: the lane's 64 fifth bits one 8-byte load more (a 256-byte run across the warp), each
      // dp4a word's 4 a shift and a mask of its half's word (BlockGeom<kQ5_KX8>).
      // (A row a warp with KB 2, so a warp keeps a row pair's loads in flight, lost as the
      // one-token kernel: 8B Q4_K_M graph 2.163 / 2.153 -> 2.505 / 2.494 ms, qwen3-next 4 layers
      // 0.337 / 0.335 -> 0.351 / 0.350; H200, one call, alternating. Q6_K's likewise. The loops
      // kept their form, rows inside units inside passes, which at KB 1 measured faster than the
      // one-tile loop before them: 8B Q4_K_M 2.237 / 2.248 -> 2.167 / 2.169 ms, one call.)
      constexpr int kTile = BlockGeom<U>::kBytes;
      const int sb = lane / 4, gq = lane % 4;
      const int n_tiles = static_cast<int>(first.n_in / 2048), n_sb = static_cast<int>(first.n_in / 256);
      constexpr bool kFifth = U == kQ5_KX8;
      constexpr int kQs = BlockGeom<U>::kQs;
      const int4 zero = make_int4(0, 0, 0, 0);
      for (int t0 = 0; t0 < n_tiles; t0 += KB) {
        uint4 hd[KB][kSRows];
        int4 qv[KB][kSRows][2];
        uint2 fifth[KB][kSRows];
#pragma unroll
        for (int u = 0; u < KB; ++u)
          if (t0 + u < n_tiles)
#pragma unroll
            for (int r = 0; r < kSRows; ++r) {
              const uint8_t* at = rows[r] + int64_t{t0 + u} * kTile;
              hd[u][r] = ldw(reinterpret_cast<const uint4*>(at) + sb);
              if constexpr (kFifth) fifth[u][r] = ldw(reinterpret_cast<const uint2*>(at + BlockGeom<U>::kFifth) + lane);
#pragma unroll
              for (int h = 0; h < 2; ++h) qv[u][r][h] = ldw(reinterpret_cast<const int4*>(at + kQs + 512 * h) + lane);
            }
        // Weights are no kernel's output: the first tile's loads may overlap the kernel before
        // (launch_dependent); x, y and the residual are read and written only after this.
        if (t0 == 0) grid_dependency_wait();
#pragma unroll
        for (int u = 0; u < KB; ++u) {
          if (t0 + u >= n_tiles) break;
          const int ib = 8 * (t0 + u) + sb;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float dx = x.q8k.d[t * n_sb + ib];
            const int32_t* xs = x.q8k.sum + t * (first.n_in / 32) + ib * 8 + 2 * gq;  // 4-byte aligned only
            int s_lo[kSRows] = {}, s_hi[kSRows] = {};
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // elements [16 h, 16 h + 16) of both sub-blocks
              const int8_t* xq = x.q8k.q + t * first.n_in + ib * 256 + 64 * gq + 16 * h;
              const int4 xlo = *reinterpret_cast<const int4*>(xq), xhi = *reinterpret_cast<const int4*>(xq + 32);
#pragma unroll
              for (int r = 0; r < kSRows; ++r) {
                if constexpr (kFifth) {
                  // Word q's byte b of lb / hb: bit 2 q (low nibbles) / 2 q + 1 of byte b of the half's word, at bit 4.
                  const uint32_t f = h == 0 ? fifth[u][r].x : fifth[u][r].y;
                  const auto at4 = [f](int k) {
                    return static_cast<int>((k <= 4 ? f << (4 - k) : f >> (k - 4)) & 0x10101010u);
                  };
                  const int4 lb = make_int4(at4(0), at4(2), at4(4), at4(6)), hb = make_int4(at4(1), at4(3), at4(5), at4(7));
                  q4k_half_dot(qv[u][r][h], lb, hb, xlo, xhi, s_lo[r], s_hi[r]);
                } else {
                  q4k_half_dot(qv[u][r][h], zero, zero, xlo, xhi, s_lo[r], s_hi[r]);
                }
              }
            }
#pragma unroll
            for (int r = 0; r < kSRows; ++r) acc[r][t] += q4k_group_value(hd[u][r], gq, s_lo[r], s_hi[r], dx, xs[0], xs[1]);
          }
        }
      }
    } else if constexpr (U == kQ6_KX8) {
      // Lane j takes super-block j / 8 of each pass (4 super-blocks, half a tile) and part
      // k = j % 8 of it, as blocks_dot's Q6_K branch does (8 lanes a super-block: half h = k / 4,
      // elements [l8, l8 + 8) of each quarter); the tile's layout (dequant.cuh) makes each of the
      // lane's 8-byte runs of ql, ql and qh one 256-byte contiguous load across the warp. KB
      // passes at a time, added in pass order.
      constexpr int kTile = BlockGeom<U>::kBytes;
      const int k = lane % 8, h = k / 4, l8 = 8 * (k % 4);
      const int n_pass = static_cast<int>(first.n_in / 1024), n_sb = static_cast<int>(first.n_in / 256);
      for (int p0 = 0; p0 < n_pass; p0 += KB) {
        uint32_t ql0[KB][kSRows][2], ql1[KB][kSRows][2], qh[KB][kSRows][2], sc[KB][kSRows][2];
        unsigned short dr[KB][kSRows];
#pragma unroll
        for (int u = 0; u < KB; ++u)
          if (p0 + u < n_pass)
#pragma unroll
            for (int r = 0; r < kSRows; ++r) {
              const int pi = p0 + u, s = 4 * (pi % 2) + lane / 8;  // the super-block within its tile
              const uint8_t* at = rows[r] + int64_t{pi / 2} * kTile;
              const uint2 a0 = ldw(reinterpret_cast<const uint2*>(at + 64 * s) + k);
              const uint2 a1 = ldw(reinterpret_cast<const uint2*>(at + 512 + 64 * s) + k);
              const uint2 a2 = ldw(reinterpret_cast<const uint2*>(at + 1024 + 64 * s) + k);
              const uint2 a3 = ldw(reinterpret_cast<const uint2*>(at + 1536 + 16 * s) + h);
              ql0[u][r][0] = a0.x, ql0[u][r][1] = a0.y, ql1[u][r][0] = a1.x, ql1[u][r][1] = a1.y;
              qh[u][r][0] = a2.x, qh[u][r][1] = a2.y, sc[u][r][0] = a3.x, sc[u][r][1] = a3.y;
              dr[u][r] = ldw(reinterpret_cast<const unsigned short*>(at + 1664) + s);
            }
        // Weights are no kernel's output: the first pass's loads may overlap the kernel before
        // (launch_dependent); x, y and the residual are read and written only after this.
        if (p0 == 0) grid_dependency_wait();
#pragma unroll
        for (int u = 0; u < KB; ++u) {
          if (p0 + u >= n_pass) break;
          const int ib = 4 * (p0 + u) + lane / 8;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            int sumi[kSRows] = {};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int2 xv = *reinterpret_cast<const int2*>(x.q8k.q + t * first.n_in + ib * 256 + 128 * h + 32 * j + l8);
              const int xs32 = q6k_offset(xv);
#pragma unroll
              for (int r = 0; r < kSRows; ++r)
                sumi[r] += q6k_scale(sc[u][r], l8 / 16 + 2 * j) * q6k_quarter_dot(ql0[u][r], ql1[u][r], qh[u][r], j, xv, xs32);
            }
            const float dx = x.q8k.d[t * n_sb + ib];
#pragma unroll
            for (int r = 0; r < kSRows; ++r)
              acc[r][t] += (dx * __half2float(__ushort_as_half(dr[u][r]))) * static_cast<float>(sumi[r]);
          }
        }
      }
    } else if constexpr (Staged<U>::kPlain) {
      // F16 / BF16 rows (16-byte aligned: staged_ok): lane j takes the 8-element groups j + 32 k,
      // KB a row and pass, so each warp load is 512 contiguous bytes; x rows are f32 (the host's
      // rounding, launch_act_round), 32 bytes a group, read after the dependency wait. (Rounding x
      // here instead, so the act_round launch before each product goes, lost: 8B BF16 graph 4.315
      // / 4.306 -> 4.622 / 4.621 ms, H200, one call, alternating; 8 conversions more an element
      // group and row, on a kernel whose arithmetic is not hidden.)
      constexpr int kR = OneRow ? 1 : kSRows;
      const int n_g = static_cast<int>(first.n_in / 8);
      for (int g0 = 0; g0 < n_g; g0 += 32 * KB) {
        uint4 wv[kR][KB];
#pragma unroll
        for (int k = 0; k < KB; ++k)
          if (lane + 32 * k < n_g - g0)
#pragma unroll
            for (int r = 0; r < kR; ++r) wv[r][k] = ldw(reinterpret_cast<const uint4*>(rows[r]) + g0 + 32 * k + lane);
        // Weights are no kernel's output: the first pass's loads may overlap the kernel before
        // (launch_dependent); x, y and the residual are read and written only after this.
        if (g0 == 0) grid_dependency_wait();
#pragma unroll
        for (int k = 0; k < KB; ++k)
          if (lane + 32 * k < n_g - g0)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
              const float4* xp = reinterpret_cast<const float4*>(x.x + t * first.x_stride) + 2 * (g0 + 32 * k + lane);
              const float4 x0 = xp[0], x1 = xp[1];
#pragma unroll
              for (int r = 0; r < kR; ++r) {
                float e[8];
                plain8_of<U>(wv[r][k], e);
                acc[r][t] += e[0] * x0.x + e[1] * x0.y + e[2] * x0.z + e[3] * x0.w + e[4] * x1.x + e[5] * x1.y +
                             e[6] * x1.z + e[7] * x1.w;
              }
            }
      }
    } else {
      constexpr int kR = OneRow ? 1 : kSRows;  // rows this warp computes
      // MXFP4X16: 16 blocks a group, the scales (a byte each) before the codes; Q4_0 / Q8_0 x8: 8,
      // the f16 scales after the quants.
      constexpr bool kMx = U == kMXFP4X16;
      constexpr int kGb = kMx ? 16 : 8;  // blocks a group
      constexpr int kGroup = BlockGeom<U>::kBytes, kBlock = kGroup / kGb;  // 144 / 18 (Q4_0), 272 / 34 (Q8_0), 272 / 17
      constexpr int kQuant = kMx ? 16 : kBlock - 2, kWords = kQuant / 16;  // a block's quants, in 16-byte words
      // Lane j's block of a pass is j + 32 k past the pass's first b0 (a multiple of 32 blocks, so
      // of groups): its quant word i at kBlock (b0 + 32 k) + qj + 128 i in the row (the group's
      // layout: dequant.cuh), its scale likewise at dj. Constant k offsets fold into the loads'
      // addresses.
      const int qj = (lane / kGb) * kGroup + (kMx ? kGb : 0) + 16 * (lane % kGb);
      const int dj = (lane / kGb) * kGroup + (kMx ? lane % kGb : 8 * kQuant + 2 * (lane % kGb));
      const int nb = static_cast<int>(first.n_in / 32);
      constexpr int kPass = 32 * KB;  // blocks a pass
      using Scale = std::conditional_t<kMx, unsigned char, unsigned short>;
      struct Pass {
        int4 q[kR][KB][kWords];
        Scale d[kR][KB];
      };
      auto load = [&](Pass& ps, int b0) {
  #pragma unroll
        for (int k = 0; k < KB; ++k)
          if (lane + 32 * k < nb - b0)
  #pragma unroll
            for (int r = 0; r < kR; ++r) {
              const uint8_t* at = rows[r] + kBlock * (b0 + 32 * k);
  #pragma unroll
              for (int i = 0; i < kWords; ++i) ps.q[r][k][i] = ldw(reinterpret_cast<const int4*>(at + qj + 128 * i));
              ps.d[r][k] = ldw(reinterpret_cast<const Scale*>(at + dj));
            }
      };
      const int8_t* const xq = x.q8 + 32 * lane;
      const float* const xd = x.d8 + lane;
      // MatmulParams::fold_in (one token): x's 1/rms, set after the wait (fold_rms_scale).
      const bool folded = NT == 1 && !Fold && x.fold.parts;  // (a producer reads none: its registers)
      float fold_s = 1.0f;
      auto compute = [&](const Pass& ps, int b0) {
  #pragma unroll
        for (int k = 0; k < KB; ++k)
          if (lane + 32 * k < nb - b0)
  #pragma unroll
            for (int t = 0; t < NT; ++t) {
              const int4* xp = reinterpret_cast<const int4*>(xq + t * first.n_in + 32 * (b0 + 32 * k));
              const int4 lo = xp[0], hi = xp[1];
              float dx = xd[t * nb + b0 + 32 * k];
              if (folded) dx = __half2float(__float2half_rn(dx * fold_s));
              [[maybe_unused]] int xs = 0;
              if constexpr (U == kQ4_0X8) xs = 8 * bytes_sum(hi, bytes_sum(lo, 0));
  #pragma unroll
              for (int r = 0; r < kR; ++r) {
                // ggml's vec_dot_q4_0_q8_0 / q8_0_q8_0 / mxfp4_q8_0 order: one integer per block,
                // scaled once.
                const float dw = kMx ? e8m0_half(ps.d[r][k]) : __half2float(__ushort_as_half(ps.d[r][k]));
                const int4* q = ps.q[r][k];
                if constexpr (kMx) {
                  // Code word m's entries (book16_halves): elements 4 m.. and 16 + 4 m.., activation
                  // words m of lo and hi.
                  const int qw[4] = {q[0].x, q[0].y, q[0].z, q[0].w}, xl[4] = {lo.x, lo.y, lo.z, lo.w},
                            xh[4] = {hi.x, hi.y, hi.z, hi.w};
                  int sum = 0;
  #pragma unroll
                  for (int m = 0; m < 4; ++m) {
                    const int2 e = book16_halves<Mxfp4Book>(static_cast<uint32_t>(qw[m]));
                    sum = __dp4a(e.y, xh[m], __dp4a(e.x, xl[m], sum));
                  }
                  acc[r][t] += static_cast<float>(sum) * (dw * dx);
                } else if constexpr (U == kQ4_0X8) {
                  const int qw[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
                  acc[r][t] += q4_0_value(qw, dw, lo, hi, xs, dx);
                } else {
                  const int qw[8] = {q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w};
                  const int xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                  int sum = 0;
  #pragma unroll
                  for (int m = 0; m < 8; ++m) sum = __dp4a(qw[m], xw[m], sum);
                  acc[r][t] += static_cast<float>(sum) * (dw * dx);
                }
              }
            }
      };
      // One pass in flight per warp: its loads, then its arithmetic. Two passes in flight (two
      // register sets, each reloaded once computed, both loaded before the dependency wait) ran
      // the 8B token slower: tg128 496.7-507.8 -> 478.2-482.0 (KB 1; H200, one call, alternating).
      for (int b0 = 0; b0 < nb; b0 += kPass) {
        Pass ps;
        load(ps, b0);
        // Weights are no kernel's output: the first pass's loads may overlap the kernel before
        // (launch_dependent); x, y and the residual are read and written only after this.
        if (b0 == 0) {
          grid_dependency_wait();
          if (folded) fold_s = fold_rms_scale(x);
        }
        compute(ps, b0);
      }
    }
  };
  if constexpr (T2 != T) {
    if (seg >= sg.t2_seg) dot(std::integral_constant<int, T2>{});
    else dot(std::integral_constant<int, T>{});
  } else {
    dot(std::integral_constant<int, T>{});
  }
  if constexpr (Fold) {
    fold_store(sg, first, row0 + rsel, acc[0][0], fold_w);
  } else if constexpr (OneRow) {
    seg_store<NT>(sg, first, NT == 1 && sg.plain, seg, row0, rsel, acc[0]);
  } else if constexpr (kNeox) {
    __shared__ __align__(16) float vals[kSRows][W];  // neox_store's
    const Args a = sg.a[seg];
    const float y0 = final_value(a, r0, 0, warp_sum(acc[0][0])), y1 = final_value(a, r1, 0, warp_sum(acc[1][0]));
    neox_store<W>(sg, seg, r0, r1, y0, y1, static_cast<int>(threadIdx.x / 32), lane == 0, true, vals);
  } else if constexpr (Rope) {
    seg_store_rope<NT>(sg, seg, row0, acc);
  } else {
#pragma unroll
    for (int r = 0; r < kSRows; ++r) seg_store<NT>(sg, first, NT == 1 && sg.plain, seg, row0, r, acc[r]);
  }
}

}  // namespace

}  // namespace frink::cuda::mm
