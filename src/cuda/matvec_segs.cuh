// What the decode kernels of matvec.cu share: the launch's products as one index space of row
// pairs (Segs) and their stores (seg_store, seg_store_rope, and neox_store with its QK-norm over
// a cluster). Only for matvec.cu and the kernel files it includes (their anonymous namespace is
// its own).
#pragma once

#include <cooperative_groups.h>

#include "cuda/block_dot.cuh"
#include "cuda/matmul_parts.cuh"
#include "cuda/norm_row.cuh"
#include "cuda/pdl.cuh"
#include "cuda/rope_math.cuh"
#include "cuda/route_token.cuh"

namespace frink::cuda::mm {

namespace {

// Rows per item of every decode kernel: a row pair, whose activation loads are shared (blocks_dot).
constexpr int kSRows = 2;

// MatmulParams::rope as a stream launch applies it (the kernel's Rope store): per product of
// the launch, whether its row pairs rotate (q, k) and where its rows are appended (k, v: the
// mirror's row *pos + token and the batch's staging row; rows as wide as the product's n_out).
struct StreamRope {
  RopeFreq f;
  const int32_t* pos;
  int64_t t0;  // the launch's first token of the batch
  int64_t head_dim, n_rot;
  bool rotate[kMaxSegs];
  float* mirror[kMaxSegs];
  float* stage[kMaxSegs];
  // Neox halves (element i of a head with i + head_dim / 2): neox_store, which also norms the
  // rotated products' heads first where qk_norm (RopeLaunch::norm_x / norm_x2).
  bool neox;
  bool qk_norm;
  const float* norm_w[kMaxSegs];
  float norm_eps[kMaxSegs];
};

// A launch's products of one input (q/k/v, gate/up; up to kMaxSegs), their row pairs one index
// space, so the small K/V products need no launches of their own (matvec_stream.cuh: v5).
struct Segs {
  Args a[kMaxSegs];
  int64_t g_end[kMaxSegs];  // end of each product's row pairs in the launch's index space
  int n;
  int t2_seg;  // matvec_reg_kernel's T2: the first product of the launch's second type (n: none)
  // No product of the launch has a bias, a scale or experts: a row's value is its sum (plus
  // the residual), stored without reading the product's epilogue Args (the kernel's store).
  bool plain;
  bool slots_settled;  // MatmulParams::slots_settled (the launch's products share one routing)
  StreamRope rope;
  bool routes;         // MatmulParams::route set (copied into `route`): matvec_narrow_kernel's RK
  RouteParams route;
  NormFold fold;  // MatmulParams::fold_out (q null: none): matvec_reg_kernel's Fold
};

// The expert of this block's slot (grid row blockIdx.y) in an expert launch (0 otherwise),
// read after the wait that the routing needs. RK 0: from slot_expert, which the routing kernel
// wrote (no wait where it finished before this launch's predecessor began: slots_settled).
// RK 4 (experts a lane: up to kRouteInLaunchMaxExperts; matvec_narrow_kernel): the launch
// routes its token itself (MatmulParams::route): warp 0 of every block ranks the experts from
// the router's logits and takes its slot's, and block (0, 0) stores the routing for the down
// product and the combine. One kernel boundary fewer on a MoE layer's chain for a top-k in
// every block. (The kernel then has the expert that slot_expert does not hold yet: select_slot
// and narrow_store take it as slot_e.)
template <int RK>
__device__ __forceinline__ int64_t block_slot_expert(const Segs& sg, const Args& first) {
  if constexpr (RK > 0) {
    __shared__ int32_t chosen[kMaxUsed];
    grid_dependency_wait();
    if (threadIdx.x < 32) route_token<RK>(sg.route, 0, chosen, blockIdx.x == 0 && blockIdx.y == 0);
    __syncthreads();
    return chosen[first.slot0 + blockIdx.y];
  } else {
    if (first.slot_expert && !sg.slots_settled) grid_dependency_wait();
    return first.slot_expert ? first.slot_expert[first.slot0 + blockIdx.y] : 0;
  }
}

// Output row row0 + r of product seg of a decode launch (bounds checked), with the slot's
// expert applied; first is sg.a[0] with select_slot applied, v the lanes' partial sums.
// plain_path (launch-uniform, sg.plain): one-token KS 1 launches store a row pair every item
// or two, without the Args epilogue (elsewhere the Args path's registers cost less than they
// would here: ptxas put the four-token and KS > 1 kernels 8-24 registers up with this path,
// some spilling).
template <int NT>
__device__ __forceinline__ void seg_store(const Segs& sg, const Args& first, bool plain_path, int seg, int64_t row0,
                                          int r, const float (&v)[NT]) {
  if (plain_path) {  // The same bits as final_value with scale 1 and no bias: epilogue's
    // v * 1 + 0 is v + 0 (a -0 sum stored as +0).
    // (Fields by value: a reference to `first` or sg.a would put `first` in local memory.)
    float* const y = seg == 0 ? first.y : sg.a[seg].y;
    const float* const res = seg == 0 ? first.residual : sg.a[seg].residual;
    const int64_t ys = seg == 0 ? first.y_stride : sg.a[seg].y_stride, row = row0 + r;
    const bool in = row < (seg == 0 ? first.n_out : sg.a[seg].n_out);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sum = warp_sum(v[t]) + 0.0f;
      if (threadIdx.x % 32 == 0 && in) y[t * ys + row] = res ? sum + res[t * ys + row] : sum;
    }
    return;
  }
  if (seg == 0) {
    if (row0 + r < first.n_out) store_row<NT>(first, row0 + r, v);
  } else if (row0 + r < sg.a[seg].n_out) {
    Args a = sg.a[seg];
    select_slot(a);
    store_row<NT>(a, row0 + r, v);
  }
}

// Rope (MatmulParams::rope; never experts): row pair row0 of product seg, its final values
// (store_row's) rotated when the rows are a rotation pair (adjacent-pair RoPE: rows 2i, 2i + 1
// of a head, 2i < n_rot; kSRows == 2 and even row0 make every pair one), stored, and appended
// for k and v, as launch_rope after the products would: the same bits (rope_math.cuh). Lane t
// takes token t; v as store_row takes it (lane partials, summed here).
template <int NT>
__device__ __forceinline__ void seg_store_rope(const Segs& sg, int seg, int64_t row0, const float (&v)[kSRows][NT]) {
  static_assert(kSRows == 2, "a row pair is a rotation pair");
  const int lane = threadIdx.x % 32;
  float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s0 = warp_sum(v[0][t]), s1 = warp_sum(v[1][t]);
    if (lane == t) y0 = s0, y1 = s1;
  }
  const Args& a = sg.a[seg];
  const StreamRope& rp = sg.rope;
  const int t = lane;
  if (t >= NT || row0 >= a.n_out) return;
  const bool two = row0 + 1 < a.n_out;  // false only on an odd-width product (v), never rotated
  y0 = final_value(a, row0, t, y0);
  if (two) y1 = final_value(a, row0 + 1, t, y1);
  const int64_t pos = *rp.pos + rp.t0 + t, i0 = row0 % rp.head_dim;
  if (rp.rotate[seg] && i0 < rp.n_rot) {
    const float2 r = rope_rotate(y0, y1, rope_cos_sin(rp.f, pos, i0 / 2));
    y0 = r.x;
    y1 = r.y;
  }
  // y, then (k, v) the mirror's and the staging rows.
  float* out[3] = {a.y + t * a.y_stride + row0, nullptr, nullptr};
  if (rp.mirror[seg]) {
    out[1] = rp.mirror[seg] + pos * a.n_out + row0;
    out[2] = rp.stage[seg] + (rp.t0 + t) * a.n_out + row0;
  }
#pragma unroll
  for (float* o : out)
    if (o) {
      o[0] = y0;
      if (two) o[1] = y1;
    }
}

// Warps a block of matvec_reg_kernel's neox RoPE launches (its W): a 128-wide head's 64
// rotation pairs are then one cluster of 8 blocks. Measured there (H200, tg128 graph ms, one
// call, two rounds alternating with the products then rope_norm_kernel; logits bit for bit):
// qwen3-8b Q8_0 2.871 / 2.870 -> 2.808 / 2.811; Q4_K_M (q/k Q4_K at 3 blocks a SM, v Q6_K a
// launch of its own) 2.366 / 2.365 -> 2.362 / 2.359.
constexpr int kRegRopeWarps = 2 * kSWarps;

// Neox RoPE (StreamRope::neox; matmul_ropes_neox held) in a product's store, for the launches
// whose row pairs are rotation pairs: product seg's pair p takes rows h hd + i and
// h hd + i + hd / 2 (h = p / (hd / 2), i = p % (hd / 2)) where it rotates (q, k), and 2p,
// 2p + 1 otherwise (v), as r0 / r1 hold on entry.
__device__ __forceinline__ void neox_rows(const StreamRope& rp, int seg, int64_t pair, int64_t& r0, int64_t& r1) {
  if (!rp.rotate[seg]) return;
  const int64_t half = rp.head_dim / 2;
  r0 = pair / half * rp.head_dim + pair % half;
  r1 = r0 + half;
}

// The store of such a pair: y0 / y1 its final values (store_row's), sub its index among the
// block's kPairs pairs, lead the thread that stores. Where rp.qk_norm rotates (QK-norm first), a
// head's pairs are one thread-block cluster's blocks (the launch's clusters start on q's and k's
// heads: matmul_can_rope), each block's rows in its vals: after a cluster barrier every warp
// gathers the head's float4s through distributed shared memory and sums their squares as
// norm_vec_row does (a lane a float4, the same tree), so the scale, the norm weights, the
// rotation (rope_math.cuh), the stores and the K/V appends are rope_norm_kernel's bits after the
// products'. A second barrier (arrive after the gather, wait before leaving) keeps every block's
// vals alive for its peers. Every thread of the block calls it.
template <int kPairs>
__device__ __forceinline__ void neox_store(const Segs& sg, int seg, int64_t r0, int64_t r1, float y0, float y1, int sub,
                                           bool lead, bool live, float (&vals)[kSRows][kPairs]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const StreamRope& rp = sg.rope;
  const bool rot = rp.rotate[seg], norm = rp.qk_norm && rot;  // norm: cluster-uniform
  const int64_t hd = rp.head_dim, half = hd / 2, i = r0 % hd, n_out = sg.a[seg].n_out;  // i < half where rot
  if (norm) {
    if (lead) vals[0][sub] = y0, vals[1][sub] = y1;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    // Lane j takes the head's float4 j and j + 32 (elements 4 j.. lie in one half and one block).
    const int lane = threadIdx.x % 32;
    float part[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t e = 4 * (lane + 32 * k), second = e >= half ? 1 : 0, ie = e - second * half;
      part[k] = 0.0f;
      if (e < hd) {
        const float* at = cluster.map_shared_rank(&vals[second][ie % kPairs], static_cast<int>(ie / kPairs));
        part[k] = sq_sum4(*reinterpret_cast<const float4*>(at));
      }
      part[k] = warp_sum(part[k]);
    }
    // norm_vec_row's block_sum over its 64 threads: warp 0's float4s, then warp 1's.
    const float ss = hd > 128 ? part[0] + part[1] : part[0];
    cluster.barrier_arrive();  // this block is done reading the others' values
    const float scale = rsqrtf(ss / static_cast<float>(hd) + rp.norm_eps[seg]);
    y0 = y0 * scale;
    y1 = y1 * scale;
    if (const float* nw = rp.norm_w[seg]) {
      y0 *= nw[i];
      y1 *= nw[i + half];
    }
  }
  const int64_t pos = *rp.pos + rp.t0;
  if (rot) {
    const float2 r = rope_rotate(y0, y1, rope_cos_sin(rp.f, pos, i));
    y0 = r.x;
    y1 = r.y;
  }
  if (live && lead) {  // y, then (k, v) the mirror's and the staging rows
    float* const y = sg.a[seg].y;
    y[r0] = y0;
    y[r1] = y1;
    if (float* const m = rp.mirror[seg]) {
      float* const st = rp.stage[seg] + rp.t0 * n_out;
      m[pos * n_out + r0] = y0;
      m[pos * n_out + r1] = y1;
      st[r0] = y0;
      st[r1] = y1;
    }
  }
  if (norm) cg::this_cluster().barrier_wait();  // no block leaves while another may read its values
#endif
}

}  // namespace

}  // namespace frink::cuda::mm
