// The narrow kernels: rows of at most a few thousand elements (MoE experts) in sub-warps of 8 or
// 16 lanes, with RoPE, routing or the experts' combine in their launch. Only for matvec.cu (its
// launches: stream_launch, narrow_combine_launch).
#pragma once

#include "cuda/block_dot.cuh"
#include "cuda/matvec_reg.cuh"
#include "cuda/matvec_segs.cuh"

namespace frink::cuda::mm {

namespace {

// Narrow rows: Q4_0 x8 rows of at most kNarrowMaxIn elements (the MoE experts' rows:
// qwen3-30b-a3b's down 768, gate/up 2048), one token, no RoPE. A warp of matvec_reg_kernel
// takes one row pair there with one block a lane or fewer (the 768-wide down leaves 8 lanes
// idle), so the grid is mostly warps' fixed work: 8192 warps, two waves, for the down's 7 MB.
// Here sub-warps of L lanes (8 or 16) each take a row pair, lane l of one the blocks l, l + L,
// ... (all in one pass: L * kNarrowBlocks cover the row), and their sums meet by shuffles
// within the sub-warp. Same block arithmetic and stores as matvec_reg_kernel's. Measured
// (H200, qwen3-30b-a3b Q4_0 tg128, graph ms a token, one call, three rounds alternating): 2.270 /
// 2.276 / 2.274 -> 2.116 / 2.119 / 2.118 (tg128 428-433 -> 460-464 t/s). 6 blocks a SM
// (76-78 registers; at 8, 64 registers, it spilled); Q8_0's two quant words a block spilled
// even at 6 (80 registers), so Q8_0 keeps matvec_reg_kernel.
constexpr int64_t kNarrowMaxIn = 2048;
constexpr int kNarrowBlocks = 4;  // blocks a lane loads per row: 16 lanes cover 2048 elements
// Sub-warp lanes a narrow Q4_0 launch takes per row pair (kNarrowBlocks blocks a lane): 8 for
// rows up to 1024 elements, 16 up to kNarrowMaxIn, else 0 (matvec_narrow_kernel's and
// matvec_narrow_combine_kernel's one rule).
constexpr int narrow_q4_0_lanes(int64_t n_in) {
  return n_in <= 8 * 32 * kNarrowBlocks ? 8 : n_in <= kNarrowMaxIn ? 16 : 0;
}

// A narrow kernel's sub-warp of L lanes: its row pair (g, past the launch's last when !live:
// such lanes still take part in the shuffles), product seg and that pair's first row.
struct NarrowPair {
  int64_t g, row0, n_out;
  int seg;
  bool live;
  const uint8_t* w;  // row0's bytes (the slot's expert applied)
  size_t row_bytes;
};
template <int L>
__device__ __forceinline__ NarrowPair narrow_pair(const Segs& sg, const Args& first, int64_t slot_e, int64_t g0,
                                                  int64_t end) {
  NarrowPair np;
  np.g = g0 + threadIdx.x % 32 / L;
  np.live = np.g < end;
  np.seg = 0;
  while (np.seg < sg.n - 1 && np.g >= sg.g_end[np.seg]) ++np.seg;
  const int seg = np.seg;
  np.row0 = (np.g - (seg > 0 ? sg.g_end[seg - 1] : 0)) * kSRows;
  const uint8_t* const w = seg == 0 ? first.w : sg.a[seg].w + slot_e * sg.a[seg].expert_bytes;
  np.row_bytes = seg == 0 ? first.row_bytes : sg.a[seg].row_bytes;
  np.n_out = seg == 0 ? first.n_out : sg.a[seg].n_out;
  np.w = w + np.row0 * np.row_bytes;
  return np;
}
// A sub-warp's L lane partials of its row pair summed, in every lane of it.
template <int L>
__device__ __forceinline__ void narrow_sum(float (&acc)[kSRows]) {
#pragma unroll
  for (int r = 0; r < kSRows; ++r)
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}
// The sub-warp's row pair sums (lane partials) reduced within its L lanes and stored by its
// first lane through the epilogue; first has select_slot applied. slot_e >= 0: the slot's
// expert, where the launch routed itself (block_slot_expert); else read from slot_expert again.
template <int L>
__device__ __forceinline__ void narrow_store(const Segs& sg, const Args& first, const NarrowPair& np, float (&acc)[kSRows],
                                             int64_t slot_e = -1) {
  narrow_sum<L>(acc);
  if (!np.live || threadIdx.x % 32 % L != 0) return;
  Args a = first;
  if (np.seg != 0) {
    a = sg.a[np.seg];
    if (slot_e >= 0) select_slot(a, slot_e);
    else select_slot(a);
  }
#pragma unroll
  for (int r = 0; r < kSRows; ++r)
    if (np.row0 + r < np.n_out) a.y[np.row0 + r] = final_value(a, np.row0 + r, 0, acc[r]);
}

// A narrow sub-warp lane's weights of a Q4_0 x8 row pair: blocks sl, sl + L, ... of rows[0]
// and rows[1] (kNarrowBlocks at most), loaded before the dependency wait (weights are no
// kernel's output), then dotted with x's Q8_0 blocks after it. One copy of the arithmetic for
// matvec_narrow_kernel and matvec_narrow_combine_kernel: their slot sums are the same bits.
struct NarrowQ4_0 {
  int4 q[kSRows][kNarrowBlocks];
  unsigned short d[kSRows][kNarrowBlocks];
};
template <int L>
__device__ __forceinline__ void narrow_q4_0_load(NarrowQ4_0& w, const uint8_t* const (&rows)[kSRows], int sl, int nb,
                                                 bool live) {
  constexpr int kGroup = BlockGeom<kQ4_0X8>::kBytes, kBlock = kGroup / 8, kQuant = kBlock - 2;  // 144, 18, 16 bytes
  // Block l + L k: group L k / 8 + l / 8 (L k is a multiple of 8), block l % 8 in it.
  const int qj = (sl / 8) * kGroup + 16 * (sl % 8), dj = (sl / 8) * kGroup + 8 * kQuant + 2 * (sl % 8);
#pragma unroll
  for (int k = 0; k < kNarrowBlocks; ++k)
    if (live && sl + L * k < nb)
#pragma unroll
      for (int r = 0; r < kSRows; ++r) {
        const uint8_t* at = rows[r] + kBlock * (L * k);
        w.q[r][k] = ldw(reinterpret_cast<const int4*>(at + qj));
        w.d[r][k] = ldw(reinterpret_cast<const unsigned short*>(at + dj));
      }
}
template <int L>
__device__ __forceinline__ void narrow_q4_0_dot(const NarrowQ4_0& w, const int8_t* q8, const float* d8, int sl, int nb,
                                                bool live, float (&acc)[kSRows]) {
#pragma unroll
  for (int k = 0; k < kNarrowBlocks; ++k)
    if (live && sl + L * k < nb) {
      const int b = sl + L * k;
      const int4* xp = reinterpret_cast<const int4*>(q8 + 32 * b);
      const int4 lo = xp[0], hi = xp[1];
      const float dx = d8[b];
      const int xs = 8 * bytes_sum(hi, bytes_sum(lo, 0));
#pragma unroll
      for (int r = 0; r < kSRows; ++r) {
        const int qw[4] = {w.q[r][k].x, w.q[r][k].y, w.q[r][k].z, w.q[r][k].w};
        acc[r] += q4_0_value(qw, __half2float(__ushort_as_half(w.d[r][k])), lo, hi, xs, dx);
      }
    }
}

// RK: block_slot_expert's.
template <int T, int L, int RK = 0>
__global__ void __launch_bounds__(kSWarps * 32, 6) matvec_narrow_kernel(Segs sg, StagedAct x) {
  static_assert(T == kQ4_0X8, "Q4_0 x8 rows");
  static_assert(L == 8 || L == 16, "whole 8-block groups a sub-warp");
  Args first = sg.a[0];
  const int64_t slot_e = block_slot_expert<RK>(sg, first);
  {
    const int64_t xr = RK > 0 ? select_slot(first, slot_e) : select_slot(first);
    x.q8 += xr * first.n_in;
    x.d8 += xr * (first.n_in / 32);
  }
  const int sl = threadIdx.x % 32 % L;
  const int64_t g0 = (int64_t{blockIdx.x} * kSWarps + threadIdx.x / 32) * (32 / L), end = sg.g_end[sg.n - 1];
  if (g0 >= end) return;  // warp-uniform; sub-warps past the end stay for the shuffles
  const NarrowPair np = narrow_pair<L>(sg, first, slot_e, g0, end);
  const uint8_t* rows[kSRows];
  rows[0] = np.w;
  rows[1] = np.row0 + 1 < np.n_out ? rows[0] + np.row_bytes : rows[0];
  const int nb = static_cast<int>(first.n_in / 32);
  NarrowQ4_0 w;
  narrow_q4_0_load<L>(w, rows, sl, nb, np.live);
  // Weights are no kernel's output: their loads may overlap the kernel before
  // (launch_dependent); x, y and the residual are read and written only after this.
  grid_dependency_wait();
  float acc[kSRows] = {};
  narrow_q4_0_dot<L>(w, x.q8, x.d8, sl, nb, np.live, acc);
  narrow_store<L>(sg, first, np, acc, RK > 0 ? slot_e : -1);
}

// The narrow neox q/k/v kernel's lanes a row pair (kNarrowBlocks blocks a lane, one pass: rows
// up to 4096 elements, whole warps past 2048) and warps a block (8 for whole-warp rows, so that
// a 128-wide head is one portable cluster of 8 blocks); 0 lanes: rows too wide.
constexpr int narrow_rope_lanes(int64_t n_in) { return n_in <= kNarrowMaxIn ? narrow_q4_0_lanes(n_in) : n_in <= 4096 ? 32 : 0; }
constexpr int narrow_rope_warps(int lanes) { return lanes == 32 ? 2 * kSWarps : kSWarps; }
// Thread-block clusters of a narrow neox q/k/v launch: blocks a head's hd / 2 rotation pairs
// take (a block's row pairs: warps * 32 / lanes), or 0 where they are not whole blocks, more
// than a portable cluster (8), or a head wider than the two float4 a lane the norm's gather holds.
constexpr int rope_cluster_of(int64_t pairs, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  return head_dim > 0 && head_dim <= 256 && head_dim % 2 == 0 && half % pairs == 0 && half / pairs <= 8
             ? static_cast<int>(half / pairs)
             : 0;
}
constexpr int narrow_rope_cluster_of(int64_t n_in, int64_t head_dim) {
  const int lanes = narrow_rope_lanes(n_in);
  return lanes == 0 ? 0 : rope_cluster_of(narrow_rope_warps(lanes) * 32 / lanes, head_dim);
}
// The same for matvec_reg_kernel's neox launches (kRegRopeWarps warps a block, a row pair each).
constexpr int reg_rope_cluster_of(int64_t head_dim) { return rope_cluster_of(kRegRopeWarps, head_dim); }
// A neox launch's grid: blocks of per_block row pairs over `pairs`, rounded up to whole clusters of c.
inline dim3 cluster_grid(int64_t pairs, int64_t per_block, int c) {
  const int64_t per_cluster = per_block * c;
  return dim3(static_cast<unsigned>((pairs + per_cluster - 1) / per_cluster * c));
}

// Neox RoPE, with the QK-norm before it, in the store of a one-token q/k/v launch of narrow
// Q4_0 x8 rows (MatmulParams::rope with RopeLaunch::neox: qwen2/qwen3-style layers): the narrow
// kernel's sub-warps on neox_rows' rotation pairs, then neox_store, so a head's pairs are the
// blocks of one cluster (narrow_rope_cluster_of) and rope_norm_kernel's launch goes. Measured
// (H200, tg128 graph ms a token, one call, two rounds alternating with the products then
// rope_norm_kernel): qwen3-30b-a3b Q4_0 1.921 / 1.915 -> 1.852 / 1.851, qwen3-8b Q4_0
// (whole-warp rows; the OneRow kernel before) 2.115 / 2.119 -> 2.047 / 2.047; logits bit for bit.
// W warps a block (narrow_rope_warps): 6 blocks a SM of 4 warps, as the narrow kernel, or 3 of 8.
template <int L, int W>
__global__ void __launch_bounds__(W * 32, 24 / W) matvec_narrow_rope_kernel(Segs sg, StagedAct x) {
  static_assert(L == 8 || L == 16 || L == 32, "whole 8-block groups a sub-warp");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters; never launched elsewhere (matmul_ropes_neox)
  constexpr int kPairs = W * 32 / L;  // row pairs a block
  __shared__ __align__(16) float vals[kSRows][kPairs];  // neox_store's
  const int sl = threadIdx.x % 32 % L, sub = static_cast<int>(threadIdx.x) / L;
  const int64_t end = sg.g_end[sg.n - 1], g = int64_t{blockIdx.x} * kPairs + sub;
  if (int64_t{blockIdx.x} * kPairs >= end) return;  // block-uniform: the grid's padding to whole clusters (in v)
  const bool live = g < end;
  int seg = 0;
  while (seg < sg.n - 1 && g >= sg.g_end[seg]) ++seg;
  // (Fields by value, as narrow_pair's: a reference would put the Args in local memory.)
  const uint8_t* const w = sg.a[seg].w;
  const size_t row_bytes = sg.a[seg].row_bytes;
  const int64_t n_out = sg.a[seg].n_out, pair = g - (seg > 0 ? sg.g_end[seg - 1] : 0);
  int64_t r0 = 2 * pair, r1 = r0 + 1 < n_out ? r0 + 1 : r0;  // v's odd last row: computed twice, stored once
  neox_rows(sg.rope, seg, pair, r0, r1);
  const uint8_t* rows[kSRows] = {w + r0 * row_bytes, w + r1 * row_bytes};
  const int nb = static_cast<int>(sg.a[0].n_in / 32);
  NarrowQ4_0 wq;
  narrow_q4_0_load<L>(wq, rows, sl, nb, live);
  // Weights are no kernel's output: their loads may overlap the kernel before
  // (launch_dependent); x, y and the position are read and written only after this.
  grid_dependency_wait();
  float acc[kSRows] = {};
  narrow_q4_0_dot<L>(wq, x.q8, x.d8, sl, nb, live, acc);
  narrow_sum<L>(acc);
  const Args a = sg.a[seg];
  neox_store<kPairs>(sg, seg, r0, r1, final_value(a, r0, 0, acc[0]), final_value(a, r1, 0, acc[1]), sub, sl == 0, live,
                     vals);
#endif
}

// Narrow K-quant rows, one token: Q4_K / Q5_K (4 lanes a super-block) and Q6_K (8) rows of at
// most 16 lanes' super-blocks (n_in <= 1024, Q6_K 512), the MoE experts' down products
// (qwen3-next-80b-a3b: 512 wide; 2048 rows an expert, 11 slots). A warp of the stream kernel
// took such a row pair with 8 or 16 of its lanes, and Q6_K's 420-byte rows (not staged: not a
// multiple of 16 bytes) took the direct kernel, a warp a row without PDL. Here sub-warps of L
// lanes, a row pair each, run blocks_dot on the rows in place (its L-lane form). Measured (H200,
// qwen3-next-80b-a3b Q4_K_M, one call each, two rounds alternating): 8 layers tg128 1613.3 /
// 1624.1 -> 1662.7 / 1701.2 t/s; 4 layers tg128 2738.1 / 2739.9 -> 2863.0 / 2856.8, and pp512
// (its slot products: about 10 rows an expert) 16628 / 16662 -> 25174 / 25085.
template <int T, int L>
__global__ void __launch_bounds__(kSWarps * 32) matvec_narrow_k_kernel(Segs sg, StagedAct x) {
  static_assert(T == kQ4_K || T == kQ5_K || T == kQ6_K, "K-quant rows");
  Args first = sg.a[0];
  grid_dependency_wait();  // blocks_dot loads the weights with the activation
  const int64_t slot_e = block_slot_expert<0>(sg, first);
  x.q8k = x.q8k.at_row(select_slot(first), first.n_in);
  const int64_t g0 = (int64_t{blockIdx.x} * kSWarps + threadIdx.x / 32) * (32 / L), end = sg.g_end[sg.n - 1];
  if (g0 >= end) return;  // warp-uniform; sub-warps past the end stay for the shuffles
  const NarrowPair np = narrow_pair<L>(sg, first, slot_e, g0, end);
  float acc2[kSRows][1] = {};
  if (np.live)
    blocks_dot<T, 1, kSRows, L>(first, x, np.w, np.row0 + 1 < np.n_out ? static_cast<int64_t>(np.row_bytes) : 0, 0,
                                static_cast<int>(first.n_in / Staged<T>::kBlockElems), acc2);
  float acc[kSRows] = {acc2[0][0], acc2[1][0]};
  narrow_store<L>(sg, first, np, acc);
}

// Sub-warp lanes a narrow K-quant launch takes per row pair (blocks_dot: 4 lanes a Q4_K / Q5_K
// super-block, 8 a Q6_K one), or 0 where rows need more than 16.
template <int T>
constexpr int narrow_k_lanes(int64_t n_in) {
  if constexpr (T == kQ4_K || T == kQ5_K || T == kQ6_K) {
    const int64_t lanes = n_in / 256 * (T == kQ6_K ? 8 : 4);
    return lanes <= 8 ? 8 : lanes <= 16 ? 16 : 0;
  }
  return 0;
}

// The MoE down product of one token with the experts' weighted sum in its store
// (MatmulParams::combine_w): y = (residual +) sum_j combine_w[j] * down_{e_j}(x_j), as the
// down's slot rows then launch_moe_combine give it, the same bits. Sub-warp i of a block of W
// warps takes slot i % k of row pair blockIdx.x * P + i / k (P = kSub / k row pairs a block;
// sub-warps past P * k idle), with the narrow kernels' arithmetic (Q4_0 x8 rows:
// matvec_narrow_kernel's; Q4_K / Q5_K / Q6_K rows: matvec_narrow_k_kernel's blocks_dot); the
// slots' sums meet in shared memory behind one barrier, and a thread a row adds them in slot
// order. Why: the combine was a launch of its own on a MoE layer's chain (3.2 us of a
// qwen3-30b-a3b layer, ncu).
// (Q4_0: matvec_narrow_kernel's 6 blocks of 4 warps a SM; 8-warp blocks at 6 spilled.)
template <int T, int L, int W>
__global__ void __launch_bounds__(W * 32, T == kQ4_0X8 ? 24 / W : 0)
    matvec_narrow_combine_kernel(Args a, const float* combine_w, int k, StagedAct x) {
  static_assert(L == 8 || L == 16, "aligned sub-warps");
  constexpr int kSub = W * 32 / L;
  __shared__ float part[kSub][kSRows];
  const int sub = threadIdx.x / L, sl = threadIdx.x % L, P = kSub / k, j = sub % k;
  const int64_t n_pairs = (a.n_out + kSRows - 1) / kSRows, g = int64_t{blockIdx.x} * P + sub / k;
  const bool live = sub < P * k && g < n_pairs;
  // The slots' experts: the routing finished before this launch's predecessor (the GLU) began
  // (MatmulParams::slots_settled, which matmul_combines_in_launch requires).
  const int64_t row0 = g * kSRows, e = live ? a.slot_expert[j] : 0;
  const bool two = row0 + 1 < a.n_out;
  const uint8_t* const w0 = a.w + e * a.expert_bytes + row0 * a.row_bytes;
  float acc[kSRows] = {};
  if constexpr (T == kQ4_0X8) {
    const uint8_t* rows[kSRows] = {w0, two ? w0 + a.row_bytes : w0};
    const int nb = static_cast<int>(a.n_in / 32);
    NarrowQ4_0 w;
    narrow_q4_0_load<L>(w, rows, sl, nb, live);
    grid_dependency_wait();
    narrow_q4_0_dot<L>(w, x.q8 + j * a.n_in, x.d8 + j * (a.n_in / 32), sl, nb, live, acc);
  } else {
    static_assert(T == kQ4_K || T == kQ5_K || T == kQ6_K, "K-quant rows");
    grid_dependency_wait();  // blocks_dot loads the weights with the activation
    x.q8k = x.q8k.at_row(j, a.n_in);
    float acc2[kSRows][1] = {};
    if (live)
      blocks_dot<T, 1, kSRows, L>(a, x, w0, two ? static_cast<int64_t>(a.row_bytes) : 0, 0,
                                  static_cast<int>(a.n_in / Staged<T>::kBlockElems), acc2);
    acc[0] = acc2[0][0];
    acc[1] = acc2[1][0];
  }
  narrow_sum<L>(acc);
  // A slot row's value as narrow_store writes it (the epilogue: scale 1, no bias).
  if (sl == 0 && live)
#pragma unroll
    for (int r = 0; r < kSRows; ++r) part[sub][r] = epilogue(a, row0 + r, acc[r]);
  __syncthreads();
  if (threadIdx.x >= P * kSRows) return;
  const int pr = threadIdx.x / kSRows, r = threadIdx.x % kSRows;
  const int64_t row = (int64_t{blockIdx.x} * P + pr) * kSRows + r;
  if (row >= a.n_out) return;
  // combine_kernel's sum, in its order.
  float o = part[pr * k][r] * combine_w[0];
  for (int i = 1; i < k; ++i) o += part[pr * k + i][r] * combine_w[i];
  a.y[row] = a.residual ? a.residual[row] + o : o;
}

// Lanes and warps of a combine launch (matvec_narrow_combine_kernel) for p's type and width:
// {L, W}, W the fewer of 4 and 8 warps whose sub-warps hold k slots, at most 16 sub-warps, or
// {0, 0}. (8-warp blocks of 8-lane sub-warps, 17 to 20 slots, gave 10% of the rows a few ulps
// off the down then launch_moe_combine (H200, kernel test); not understood, so not taken.)
struct CombineShape {
  int lanes, warps;
};
constexpr CombineShape combine_shape(int type, int64_t n_in, int64_t k) {
  int lanes = 0;
  if (type == kQ4_0X8) lanes = narrow_q4_0_lanes(n_in);
  if (type == kQ4_K) lanes = narrow_k_lanes<kQ4_K>(n_in);
  if (type == kQ5_K) lanes = narrow_k_lanes<kQ5_K>(n_in);
  if (type == kQ6_K) lanes = narrow_k_lanes<kQ6_K>(n_in);
  if (lanes == 0 || k < 1) return {0, 0};
  for (int w : {kSWarps, 2 * kSWarps})
    if (w * 32 / lanes >= k && w * 32 / lanes <= 16) return {lanes, w};
  return {0, 0};
}

}  // namespace

}  // namespace frink::cuda::mm
