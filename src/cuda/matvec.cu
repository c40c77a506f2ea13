// Matrix-vector products for decode batches (n_tok <= kMatvecMaxTok) and expert slots: each
// weight read once, dequantized in the kernel (see matmul.cuh).
//
// Notebook:
// v1 (this): one warp per weight row, 8 rows per 256-thread block; each lane decodes whole
//   32-element pieces (dequant32) and dots them with NT activation rows read as float4 from
//   L1, then a warp-shuffle reduction. Plain types read 8 elements (16 B of f16) per lane
//   per step. Measured (H200, llama3.1-8b synth, bench -p 512 -n 128 -r 2): Q4_0 tg128 68.8 tok/s
//   (290 GB/s), Q8_0 65.7 tok/s (524 GB/s).
// v2: Q4_0 and Q8_0 with act_round set go to matvec_q8_kernel: x quantized once per matmul to
//   int8 Q8_0 blocks (the host's rounding), 4-byte weight/activation chunks, __dp4a, one f32
//   scale per 32-block, 4 rows (warps) per block. Same H200 run: Q4_0 tg128 148.3 tok/s
//   (626 GB/s), pp512 3598; Q8_0 tg128 132.4 tok/s (1056 GB/s), pp512 3629 (pp512 goes through
//   cuBLAS, unchanged). Still ~15-25% of 4.3 TB/s: the rest of the token is elsewhere
//   (other kernels, launches); not yet profiled. Other types still take v1.
// v2 measured again (b0f2842, CUDA graph per token, ncu): Q4_0 tg128 189 tok/s, of which the
//   dp4a kernel 2.97 ms/token = 1.42 TB/s (33% of 4.3 TB/s); Q8_0 3.97 ms = 2.0 TB/s; BF16's
//   f32-path matvec_kernel 6.96 ms = 2.2 TB/s.
// v3: staged kernels: rows copied to shared memory in 16-byte cp.async chunks, two in flight
//   per warp, v2's block arithmetic on the copy; F16/BF16 too. Q4_0 tg128 224 tok/s, Q8_0 191,
//   BF16 146 (with a one-pass norm). v4: the stream kernel (matvec_stream_kernel below).
#include <type_traits>

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "cuda/block_dot.cuh"
#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"
#include "cuda/norm_row.cuh"
#include "cuda/occupancy.h"
#include "cuda/pdl.cuh"
#include "cuda/q8_0_rule.cuh"
#include "cuda/rope_math.cuh"
#include "cuda/route_token.cuh"

namespace frink::cuda::mm {

namespace {

// The generic kernel's rows (warps) per block: 8, or 1 for products of fewer than
// kFewRows rows, so that every row gets an SM of its own. Why: the MoE router (128 F32 rows of
// 2048) ran as 16 blocks of 8 rows, 16 SMs each pulling 64 KB. Measured (qwen3-30b-a3b tg128
// graph, H200, one call, alternating): the weights' loads before the dependency wait 2.829 ->
// 2.724 ms; then one-row blocks with 16-byte loads, with routing's packed top-k (moe.cu),
// 2.728 -> 2.645.
constexpr int kWarpsPerBlock = 8, kFewRows = 1024;

template <int T, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) matvec_kernel(Args a) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.n_out) return;
  if (a.slot_expert) grid_dependency_wait();  // the slots' experts come from the routing kernel
  a.x += select_slot(a) * a.x_stride;
  const uint8_t* wr = a.w + row * a.row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if constexpr (kIsPlain<T>) {
    // 8 elements per lane per step while whole 8-groups remain, then a scalar tail.
    const int64_t n8 = (a.n_in % 8 == 0 && a.x_stride % 4 == 0) ? a.n_in / 8 : 0;
    // The first kPre steps' weights are loaded before the dependency wait (launch_dependent):
    // weights are no kernel's output, so their round trip overlaps the kernel before. The MoE
    // router (128 F32 rows of 2048: 8 steps a lane) then waits only for x.
    constexpr int kPre = NT == 1 ? 8 : 4;
    const bool vec = reinterpret_cast<uintptr_t>(wr) % 16 == 0;  // warp-uniform
    // Step g's 8 weights dotted with each token's x.
    const auto add8 = [&](int64_t g, const float (&w)[8]) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(a.x + t * a.x_stride + g * 8);
        const float4 x0 = xp[0], x1 = xp[1];
        acc[t] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y +
                  w[6] * x1.z + w[7] * x1.w;
      }
    };
    float wp[kPre][8];
#pragma unroll
    for (int s = 0; s < kPre; ++s)
      if (lane + 32 * s < n8) plain8_at<T>(wr, lane + 32 * s, vec, wp[s]);
    grid_dependency_wait();
#pragma unroll
    for (int s = 0; s < kPre; ++s)
      if (lane + 32 * s < n8) add8(lane + 32 * s, wp[s]);
    // Four steps' loads in flight: an MoE router (128 F32 rows of 2048, one warp each, so one
    // warp per SM) walked its 8 steps one memory round trip at a time, 5.8 us (qwen3-30b-a3b
    // decode, ncu).
#pragma unroll 4
    for (int64_t g = lane + 32 * kPre; g < n8; g += 32) {
      float w[8];
      plain8_at<T>(wr, g, vec, w);
      add8(g, w);
    }
    for (int64_t i = n8 * 8 + lane; i < a.n_in; i += 32) {
      const float w = plain_at<T>(wr, i);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] += w * a.x[t * a.x_stride + i];
    }
  } else {
    grid_dependency_wait();
    const int64_t n_sub = a.n_in / 32;
    for (int64_t s = lane; s < n_sub; s += 32) {
      float w[32];
      dequant32<T>(wr, s, w);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(a.x + t * a.x_stride + s * 32);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 xv = xp[i];
          sum += w[4 * i] * xv.x + w[4 * i + 1] * xv.y + w[4 * i + 2] * xv.z + w[4 * i + 3] * xv.w;
        }
        acc[t] += sum;
      }
    }
  }
  store_row<NT>(a, row, acc);
}


// The stream kernel (v3 -> v5). ncu of v3 (one warp per row pair, two chunks in flight, one
// launch per product; 8B Q4_0 decode): gate/up 17.3 us each (1.9 TB/s, DRAM 40%, SM 46%),
// down 22 us, wo 8 us, q 8 us, k/v 6.3 us each (0.37 TB/s: launch and ramp bound).
// v4 filled the GPU once (resident warps from the occupancy API), each warp walking several
// (row pair, chunk) items with 3 stages: slower on every product (down 28 us, gate+up 38 us,
// Q4_0 tg128 205 tok/s against v3's 224), since each warp's arithmetic, not the loads in
// flight, was then the limit, and fewer warps shared it. v5 keeps v3's one warp per row pair
// and v4's grouping: a launch holds up to kMaxSegs products of one input (q/k/v, gate/up),
// their row pairs one index space, so the small K/V products need no launches of their own
// (v4's grouped q/k/v: 12.9 us against 20.6 us in three launches).
constexpr int kSRows = 2;   // rows per item (their activation loads shared, see blocks_dot)
constexpr int kStages = 2;  // items per warp in shared memory (S): S - 1 in flight; 3 in two cases (below)
// Chunks up to this many bytes also have a three-stage kernel (27.6 KB a block, 8 a SM).
constexpr int kThreeStageMaxChunk = 1152;
// KS == 2 launches of rows of this many chunks or more take it (matvec_stream_launch).
constexpr int64_t kThreeStageMinChunks = 5;

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

// KS warps of a block share a row pair (KS = 1, 2 or 4), each walking every KS-th chunk of
// its rows, and their partial sums meet in shared memory. Why: ncu showed the 8B Q4_0 down
// product (7 chunks a row) at 16 us even with its 33 MB in L2, at 24% occupancy: 2048 warps,
// one per row pair, each walking its chunks one after another. KS > 1 runs one row pair per
// warp group (the launch sizes the grid so), as the block meets one barrier at the end.
// Rope: the store applies MatmulParams::rope (store_rope below); only q/k/v launches carry it.
// Registers: ptxas's own choice (46-56 for one token), but Q8_0's split launches are held to
// 40 (12 blocks a SM, by the launch bound) without spilling: 8B Q8_0 tg128 graph 3.423 /
// 3.422 -> 3.397 / 3.395 ms (H200, one call, alternating). The same bound on every type
// spilled Q4_0's pairs and Q4_K (Q4_0 2.42 -> 2.83 ms) and slowed BF16 (4.87 -> 5.18 ms,
// unspilled); a bound of one block a SM let ptxas take 68-99 registers (Q8_0 3.41 -> 4.10
// ms): each type has its own best occupancy.
template <int T, int NT, int KS, bool Rope = false, int S = kStages>
__global__ void __launch_bounds__(kSWarps * 32, T == kQ8_0 && NT == 1 && KS > 1 ? 12 : 0)
    matvec_stream_kernel(Segs sg, StagedAct x) {
  static_assert(!Staged<T>::kPlain, "F16 / BF16 rows go to matvec_reg_kernel");
  static_assert(KS == 1 || KS == 2 || KS == 4, "warps per row pair");
  constexpr int kChunk = Staged<T>::kChunk;
  constexpr int kPairs = kSWarps / KS;  // row pairs per block
  __shared__ __align__(16) uint8_t sm[kSWarps][S][kSRows][kChunk];
  // Expert mode: select_slot points each product at the slot's expert (all the launch's
  // products follow one routing: launch_matmuls groups them so); `first` once here, the
  // others where their rows are copied (w + e * expert_bytes) and stored.
  Args first = sg.a[0];
  // (Without slots_settled the wait comes first; then the weights' first copies below overlap
  // the predecessor too.)
  const int64_t slot_e = block_slot_expert<0>(sg, first);
  {
    const int64_t xr = select_slot(first);
    if constexpr (T == kQ4_K || T == kQ5_K || T == kQ6_K) x.q8k = x.q8k.at_row(xr, first.n_in);
    else {
      x.q8 += xr * first.n_in;
      x.d8 += xr * (first.n_in / 32);
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % KS;
  const int64_t n_warps = int64_t{gridDim.x} * kPairs, wg = int64_t{blockIdx.x} * kPairs + warp / KS;
  const int64_t n_groups = sg.g_end[sg.n - 1];
  if constexpr (KS == 1)
    if (wg >= n_groups) return;  // warp-uniform; no block-wide barrier below when KS == 1
  const int64_t n_blocks = first.n_in / Staged<T>::kBlockElems;
  const int64_t n_chunks = (n_blocks + Staged<T>::kBlocks - 1) / Staged<T>::kBlocks;
  // This warp's chunks of a row pair: part, part + KS, ... (KS == 1 spelled apart: the same
  // code as before KS, which ptxas fits in 48 registers without spilling).
  // Items and chunks in 32 bits (a warp's items and a row's chunks fit an int): each 64-bit
  // counter step and compare was two instructions in the item loop (SASS, fourteenth session).
  const int n_chunks32 = static_cast<int>(n_chunks);
  int n_items;
  if constexpr (KS == 1) {
    n_items = static_cast<int>(((n_groups - 1 - wg) / n_warps + 1) * n_chunks);
  } else {
    const int n_mine = n_chunks32 > part ? (n_chunks32 - 1 - part) / KS + 1 : 0;
    n_items = wg < n_groups ? n_mine : 0;  // one row pair per warp group (the launch's grid)
  }
  // Row pair g: its product's index and first row. (Returning a reference to `first` or to
  // sg.a would put `first` in local memory, read in the inner loop: products go by index.)
  auto locate = [&](int64_t g, int64_t& row0) {
    int seg = 0;
    while (g >= sg.g_end[seg]) ++seg;
    row0 = (g - (seg > 0 ? sg.g_end[seg - 1] : 0)) * kSRows;
    return seg;
  };
  // (32-bit: a row's blocks and chunks fit an int.)
  const int n_blocks32 = static_cast<int>(n_blocks);
  auto chunk_blocks = [&](int c) { return min(Staged<T>::kBlocks, n_blocks32 - c * Staged<T>::kBlocks); };
  // KS == 1: a warp's items walk the chunks of row pairs wg, wg + n_warps, ...; an Item
  // (chunk c of row pair g: product seg, first row row0) advanced step by step, not derived
  // from the item index: it / n_chunks and it % n_chunks cost a 64-bit (or, when both fit,
  // 32-bit) division subroutine per chunk for the copy, the dot and the store. Measured (H200,
  // 8B tg128 graph, one call, alternating): Q4_0 2.186 / 2.194 -> 2.165 / 2.161 ms, Q4_K_M
  // 2.537 / 2.538 -> 2.499 / 2.501. KS > 1 (one row pair a warp group): chunk part + KS * it,
  // the pair looked up per copy; cursors there cost Q8_0 (held to 40 registers) 3.29 -> 3.43 ms.
  struct Item {
    int c;
    int64_t g, row0;
    int seg;
    // The copy's first row start, and the step to the second: row_bytes, or 0 for a product's
    // odd last row pair. (Two pointers spilled the Q4_K kernel, 72 registers; this way, graph
    // Q4_K_M 8 layers 0.707 / 0.706 -> 0.696 / 0.698 ms, BF16 8 layers 1.340 / 1.339 -> 1.325 /
    // 1.328, Q4_0 level; H200, one call, alternating.)
    const uint8_t* p;
    uint32_t step;
  };
  // Row starts of row pair (seg, row0), the slot's expert applied.
  auto row_starts = [&](Item& m) {
    const uint8_t* w = m.seg == 0 ? first.w : sg.a[m.seg].w + slot_e * sg.a[m.seg].expert_bytes;
    const size_t row_bytes = m.seg == 0 ? first.row_bytes : sg.a[m.seg].row_bytes;
    const int64_t n_out = m.seg == 0 ? first.n_out : sg.a[m.seg].n_out;
    m.p = w + m.row0 * row_bytes;
    m.step = m.row0 + 1 < n_out ? static_cast<uint32_t>(row_bytes) : 0u;
  };
  // The item's row starts follow it (p at its chunk: the copy adds no chunk offset).
  auto advance = [&](Item& m) {
    if (++m.c == n_chunks32) {
      m.c = 0;
      m.g += n_warps;
      if (m.g < n_groups) {
        m.seg = locate(m.g, m.row0);
        row_starts(m);
      }
    } else {
      m.p += Staged<T>::kChunk;
    }
  };
  Item head{0, wg, 0, 0, nullptr, 0};  // KS == 1: the next item to copy
  if (KS == 1 && wg < n_groups) {
    head.seg = locate(wg, head.row0);
    row_starts(head);
  }
  // KS == 1: the items issued and not yet computed (S - 1), oldest first: the compute side
  // takes its chunk, product and first row from here where it walked a cursor of its own
  // (locate again at every row pair: about 28 instructions an item, SASS, fourteenth session).
  // Shifted by constant indices, so the ring stays in registers.
  struct Pend {  // 32 bits each (rows of a product and chunks of a row fit an int): registers
    int c, seg, row0;
  };
  Pend ring[S - 1];
  auto shift = [&] {
#pragma unroll
    for (int i = 0; i + 1 < S - 1; ++i) ring[i] = ring[i + 1];
  };
  // The stages' shared-memory address as cp.async takes it (32 bits): the generic pointer's
  // conversion cost an S2R and a shift per copy (SASS). With the row starts kept in the Item
  // (KS == 1), 8B graph (H200, one call, alternating): Q8_0 3.171 / 3.174 -> 3.132 / 3.138 ms,
  // Q4_K_M (8 layers) 0.716 / 0.715 -> 0.705 / 0.705, Q4_0 2.101 / 2.094 -> 2.104 / 2.100.
  // The lane's first 16 bytes in them, kept in a register: ptxas rematerialized the address
  // (S2R SR_CgaCtaId, LEA, two IMAD) in every copy.
  uint32_t sm_lane = static_cast<uint32_t>(__cvta_generic_to_shared(&sm[warp][0][0][0])) + 16 * lane;
  asm volatile("" : "+r"(sm_lane));
  // Item it into stage it % S: 16-byte copies, lanes strided (coalesced). A product's odd
  // last row pair copies its last row twice (computed, never stored).
  auto issue = [&](int it) {
    if (it >= n_items) return;
    int c;
    const uint8_t* rows[kSRows];  // the chunk's bytes in each row
    if constexpr (KS == 1) {
      c = head.c;
      ring[S - 2] = {head.c, head.seg, static_cast<int>(head.row0)};
#pragma unroll
      for (int r = 0; r < kSRows; ++r) rows[r] = head.p + r * head.step;
      advance(head);
    } else {
      c = part + KS * it;
      Item m{c, wg, 0, 0, nullptr, 0};
      m.seg = locate(wg, m.row0);
      row_starts(m);
#pragma unroll
      for (int r = 0; r < kSRows; ++r) rows[r] = m.p + r * m.step + c * Staged<T>::kChunk;
    }
    const int bytes = chunk_blocks(c) * Staged<T>::kBlockBytes;
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
      // Quantized chunks: a fixed count of predicated copies per lane (a loop to `bytes`
      // compiled to an unrolled loop with remainder branches: with the cursors above, 8B graph
      // Q4_0 -4.6%, Q8_0 -3.3%, Q4_K_M -5.1%). The lane's copies at constant offsets from its
      // first (512 bytes apart), which ptxas folds into the copy's address: with the offset
      // 16 (lane + 32 k) added per copy, each cost a 64-bit add (SASS, fourteenth session).
      const uint32_t dst = sm_lane + static_cast<uint32_t>(((it % S) * kSRows + r) * kChunk);
      const uint8_t* const src_l = rows[r] + 16 * lane;
      const int lim = bytes - 16 * lane;  // copy k when 512 k < lim
      constexpr int kPerLane = (kChunk / 16 + 31) / 32;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k)
        if (512 * k < lim)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 512 * k), "l"(src_l + 512 * k)
                       : "memory");
    }
  };
  auto store = [&](int seg, int64_t row0, int r, const float (&v)[NT]) {
    seg_store<NT>(sg, first, KS == 1 && NT == 1 && sg.plain, seg, row0, r, v);
  };
  auto store_rope = [&](int seg, int64_t row0, const float (&v)[kSRows][NT]) { seg_store_rope<NT>(sg, seg, row0, v); };
  float acc[kSRows][NT];
#pragma unroll
  for (int r = 0; r < kSRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if constexpr (KS == 1) shift();
    issue(st);
    __pipeline_commit();
  }
  // Weights are no kernel's output: their first copies above may overlap the previous kernel
  // (launch_dependent); x, y and the residual are read and written only after this.
  grid_dependency_wait();
  for (int it = 0; it < n_items; ++it) {
    [[maybe_unused]] Pend cur;  // KS == 1: item it
    if constexpr (KS == 1) {
      cur = ring[0];
      shift();
    }
    issue(it + S - 1);
    __pipeline_commit();                 // possibly empty: one group per item keeps the count simple
    int c;
    if constexpr (KS == 1) c = cur.c;
    else c = part + KS * it;
    // One token (LaneDot): the lane's activation loaded before the wait for the item's weights,
    // its round trip overlapping theirs. Loaded after, it was the wait that began every item:
    // the kernel with constant activations instead ran the 8B token in 1.88 ms against 2.20
    // (an AB-TEMP build; H200, docs/gpu-notes.md, twelfth session); Q4_0 pairs this way, 8B
    // graph 2.101-2.105 -> 2.075-2.078 ms (H200, one call, alternating).
    constexpr bool kActFirst = NT == 1 && LaneDot<T>::kOn;
    [[maybe_unused]] typename LaneDot<T>::Act xa;
    if constexpr (kActFirst) xa = LaneDot<T>::act(x, c * Staged<T>::kBlocks, chunk_blocks(c));
    __pipeline_wait_prior(S - 1);        // item it has landed (this lane's copies)
    __syncwarp();                        // ... and every lane's
    if constexpr (kActFirst)
      LaneDot<T>::template dot<kSRows>(sm[warp][it % S][0], kChunk, chunk_blocks(c), xa, acc);
    else
      blocks_dot<T, NT, kSRows>(first, x, sm[warp][it % S][0], kChunk, c * Staged<T>::kBlocks, chunk_blocks(c),
                                acc);
    __syncwarp();  // stage it % S is read by all lanes before item it + S overwrites it
    if constexpr (KS == 1) {
      if (c == n_chunks32 - 1) {
        if constexpr (Rope) store_rope(cur.seg, cur.row0, acc);
#pragma unroll
        for (int r = 0; r < kSRows; ++r) {
          if constexpr (!Rope) store(cur.seg, cur.row0, r, acc[r]);
#pragma unroll
          for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
        }
      }
    }
  }
  if constexpr (KS > 1) {
    // Each warp's partial sums (lane-reduced), then the pair's first warp adds its group's in
    // part order (a fixed order: the result does not depend on timing) and stores.
    __shared__ float red[kSWarps][kSRows][NT];
#pragma unroll
    for (int r = 0; r < kSRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[r][t]);
        if (lane == 0) red[warp][r][t] = v;
      }
    __syncthreads();
    if (part == 0 && wg < n_groups) {
      int64_t row0;
      const int seg = locate(wg, row0);
      float v[kSRows][NT];
#pragma unroll
      for (int r = 0; r < kSRows; ++r) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          v[r][t] = red[warp][r][t];
#pragma unroll
          for (int j = 1; j < KS; ++j) v[r][t] += red[warp + j][r][t];
          v[r][t] = lane == 0 ? v[r][t] : 0.0f;  // store_row sums over the lanes: lane 0 carries the value
        }
        if constexpr (!Rope) store(seg, row0, r, v[r]);
      }
      if constexpr (Rope) store_rope(seg, row0, v);
    }
  }
}

// The dp4a families on rows the staged kernel cannot copy (not 16-byte aligned): the same
// block arithmetic straight from global memory, kSWarps rows per block.
template <int T, int NT>
__global__ void __launch_bounds__(kSWarps * 32) matvec_direct_kernel(Args a, StagedAct x) {
  {
    const int64_t xr = select_slot(a);
    if constexpr (T == kQ4_K || T == kQ5_K || T == kQ6_K) x.q8k = x.q8k.at_row(xr, a.n_in);
    else {
      x.q8 += xr * a.n_in;
      x.d8 += xr * (a.n_in / 32);
    }
  }
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSWarps + threadIdx.x / 32;
  if (row >= a.n_out) return;
  float acc[1][NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[0][t] = 0.0f;
  blocks_dot<T, NT, 1>(a, x, a.w + row * a.row_bytes, 0, 0, static_cast<int>(a.n_in / Staged<T>::kBlockElems), acc);
  store_row<NT>(a, row, acc[0]);
}

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

// MatmulParams::rope for the products ps[0, n) of one stream launch (launch_matmuls checked
// it: matmul_can_rope); pos null when none carries it.
StreamRope stream_rope(const MatmulParams* ps, int n) {
  StreamRope s{};
  const RopeLaunch* r = nullptr;
  for (int i = 0; i < n; ++i) r = ps[i].rope ? ps[i].rope : r;
  if (!r) return s;
  s.f = rope_freq(*r);
  s.pos = r->pos;
  s.head_dim = r->head_dim;
  s.n_rot = r->n_rot;
  s.neox = r->neox;
  s.qk_norm = r->qk_norm;
  for (int i = 0; i < n; ++i) {
    const RopeRole role = ps[i].rope ? rope_role(*r, ps[i]) : RopeRole::kNone;
    s.rotate[i] = role == RopeRole::kQ || role == RopeRole::kK;
    const NormParams& qk = role == RopeRole::kQ ? r->norm_x : r->norm_x2;
    const bool norm = r->qk_norm && s.rotate[i];
    s.norm_w[i] = norm ? qk.w : nullptr;
    s.norm_eps[i] = norm ? qk.eps : 0.0f;
    s.mirror[i] = role == RopeRole::kK ? r->mirror_k : role == RopeRole::kV ? r->mirror_v : nullptr;
    s.stage[i] = role == RopeRole::kK ? r->stage_k : role == RopeRole::kV ? r->stage_v : nullptr;
  }
  return s;
}

// The activation of launch rows from t0 on.
template <int T>
StagedAct act_at(StagedAct x, int64_t t0, int64_t n_in) {
  if constexpr (Staged<T>::kPlain) return x;  // f32 rows: follow Args::x (args_at)
  else if constexpr (dp4a_act_for(T) == kActDp4aK)  // Q8_K rows
    x.q8k = x.q8k.at_row(t0, n_in);
  else {
    x.q8 += t0 * n_in;
    x.d8 += t0 * (n_in / 32);
  }
  return x;
}

}  // namespace

// Whether W's rows suit the staged kernels: 16-byte aligned starts (and expert stacks).
bool staged_ok(const MatmulParams& p) {
  return p.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && p.expert_bytes % 16 == 0 &&
         (p.type != kBF16 && p.type != kF16
              ? true
              : p.n_in % 8 == 0 && p.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0);
}

template <int T>
void matvec_launch(const MatmulParams& p, const Args& a0) {
  const int64_t wpb = p.n_out < kFewRows ? 1 : kWarpsPerBlock;
  const auto grid_x = static_cast<unsigned>((p.n_out + wpb - 1) / wpb);
  const auto threads = static_cast<unsigned>(wpb * 32);
  launch_rows(p, a0, grid_x, [&](const Args& a, dim3 g, int64_t, bool four) {
    if (four) launch_dependent(matvec_kernel<T, 4>, g, threads, 0, p.stream, a);
    else launch_dependent(matvec_kernel<T, 1>, g, threads, 0, p.stream, a);
    FRINK_CUDA_CHECK_LAUNCH();
  });
}

// Warps per row pair for rows of n_chunks chunks: 2 from 3 chunks, 4 from 8. Measured (H200,
// 8B tg128, one call): BF16 170.9 -> 183.7, Q8_0 230.7 -> 236.7, Q4_0 309.6 -> 310.3. Two
// warps for two-chunk rows when one warp per pair leaves the GPU less than a wave (the 8B
// q/k/v and wo, 8.2 and 7.5 us in ncu at 34% and 25% occupancy) measured no better: Q4_0
// 311.1 and 310.1 against 312.4 and 317.4 without (one call, alternating); nor for the 8B
// gate/up (2 chunks, 2.7 waves): 327.2/326.0 against 329.5/328.0. 7-chunk rows (the Q4_0 and
// Q4_K/Q6_K 8B down: 8064 or 11760 bytes) take 2, not 4: their grid then fits one wave of
// resident blocks (1024 blocks, ~10 per SM) instead of 1.55, whose second, partial wave
// costs a whole memory round trip: Q4_0 320.6/321.4 -> 329.5/328.0, Q4_K_M 257.8/259.3 ->
// 260.2/260.9 (one call, alternating). Q8_0 (14 chunks) and BF16 (28) keep 4.
static int matvec_ksplit(int64_t n_chunks) { return n_chunks >= 8 ? 4 : n_chunks >= 3 ? 2 : 1; }

// Blocks of a stream kernel resident at once on the device (one wave).
static int64_t stream_resident(const void* kernel) { return resident_blocks(kernel, kSWarps * 32, 0); }

// Grid x for a KS == 1 stream launch of grid g: a grid of more than one wave of resident
// blocks but at most two is cut to one wave, its warps walking a second row pair (the kernel's
// grid-stride loop), so no partial second wave costs a whole memory round trip. It hits the
// MoE expert products (qwen3-30b-a3b: gate/up 1536 blocks, down 2048, one-chunk rows):
// tg128 282.0 / 282.8 / 283.3 -> 285.6 / 287.5 / 283.7 (H200, one call, alternating). Dense 8B
// grids are under one wave or over two (gate/up 2.7 waves: walking 2-3 row pairs per warp
// was v4, slower), and KS > 1 launches are one row pair per warp group: both unchanged.
static unsigned one_wave_x(const void* kernel, dim3 g) {
  const int64_t w = stream_resident(kernel);
  const int64_t total = int64_t{g.x} * g.y;
  if (w <= 0 || total <= w || total > 2 * w) return g.x;
  return static_cast<unsigned>(std::max<int64_t>(1, (w / g.y)));
}

// MatmulParams::combine_w's launch (matmul_combines_in_launch held): P row pairs a block.
template <int T>
void narrow_combine_launch(const MatmulParams& p, const StagedAct& x) {
  const Args a = args_of(p);
  const int k = static_cast<int>(p.n_slots);
  const CombineShape c = combine_shape(T, p.n_in, k);
  const int64_t n_pairs = (p.n_out + kSRows - 1) / kSRows, P = c.warps * 32 / c.lanes / k;
  const auto go = [&](auto kernel) {
    launch_dependent(kernel, dim3(static_cast<unsigned>((n_pairs + P - 1) / P)), dim3(c.warps * 32), 0, p.stream, a,
                     p.combine_w, k, x);
  };
  if (c.lanes == 8) go(matvec_narrow_combine_kernel<T, 8, kSWarps>);  // 16 sub-warps (combine_shape)
  else if (c.warps == kSWarps) go(matvec_narrow_combine_kernel<T, 16, kSWarps>);
  else go(matvec_narrow_combine_kernel<T, 16, 2 * kSWarps>);
}

// Products ps[0, n) of one input (and type: T, or T's then T2's, two_type_launch) on the stream
// kernel, or one product at a time on the direct kernel when its rows cannot be staged
// (staged_ok). Expert mode: products of one routing (same slots and x_div).
template <int T, int T2>
void stream_launch(const MatmulParams* ps, int n, const StagedAct& x0) {
  const MatmulParams& p = ps[0];
  if constexpr (T == kQ4_0X8 || T == kQ4_K || T == kQ5_K || T == kQ6_K) {
    if (p.combine_w) {
      FRINK_CUDA_CHECK(n == 1 && matmul_combines_in_launch(p) ? cudaSuccess : cudaErrorInvalidValue);
      narrow_combine_launch<T>(p, x0);
      return;
    }
  }
  FRINK_CUDA_CHECK(!p.combine_w ? cudaSuccess : cudaErrorInvalidValue);
  // A NormFold in or out: only where matvec_reg_kernel takes the launch (the predicates say which).
  FRINK_CUDA_CHECK(!p.fold_out || (n == 1 && matmul_folds_norm(p)) ? cudaSuccess : cudaErrorInvalidValue);
  if (x0.fold.parts)
    for (int i = 0; i < n; ++i)
      FRINK_CUDA_CHECK(ps[i].n_tok == 1 && !ps[i].slot_expert &&
                               matmul_takes_folded_norm(ps[i].type, ps[i].n_in, ps[i].rope && ps[i].rope->neox)
                           ? cudaSuccess
                           : cudaErrorInvalidValue);
  bool staged = true;
  for (int i = 0; i < n; ++i) staged = staged && staged_ok(ps[i]);
  if constexpr (T == kQ4_0)
    if (staged && p.q4_0_pairs != 0) {
      stream_launch<kQ4_0Pairs, kQ4_0Pairs>(ps, n, x0);
      return;
    }
  const StreamRope rope = stream_rope(ps, n);  // matmul_can_rope held: staged rows
  FRINK_CUDA_CHECK(!rope.pos || staged ? cudaSuccess : cudaErrorInvalidValue);
  // One-token K-quant rows of few super-blocks, staged or not: matvec_narrow_k_kernel.
  const int narrow_k = !rope.pos && (p.slot_expert || p.n_tok == 1) ? narrow_k_lanes<T>(p.n_in) : 0;
  if (!staged && narrow_k == 0) {
    // Plain types without staging take matvec_kernel (dispatch); kQ4_0Pairs needs the staged
    // chunk's 4-byte alignment, and is only chosen with staged rows.
    // x8 rows are whole groups of 144, 272, 1152 or 1680 bytes from an allocation's start: always staged.
    FRINK_CUDA_CHECK(!kIsX8<T> ? cudaSuccess : cudaErrorInvalidValue);
    if constexpr (!Staged<T>::kPlain && T != kQ4_0Pairs && !kIsX8<T>) {
      for (int i = 0; i < n; ++i)
        launch_rows(ps[i], args_of(ps[i]), static_cast<unsigned>((ps[i].n_out + kSWarps - 1) / kSWarps),
                    [&](const Args& a, dim3 g, int64_t t0, bool four) {
                      const StagedAct x = act_at<T>(x0, t0, p.n_in);
                      if (four) matvec_direct_kernel<T, 4><<<g, kSWarps * 32, 0, p.stream>>>(a, x);
                      else matvec_direct_kernel<T, 1><<<g, kSWarps * 32, 0, p.stream>>>(a, x);
                      FRINK_CUDA_CHECK_LAUNCH();
                    });
    }
    return;
  }
  Segs sg{};
  sg.n = n;
  sg.t2_seg = n;
  for (int i = n - 1; i > 0 && T2 != T && ps[i].type == T2; --i) sg.t2_seg = i;
  sg.rope = rope;
  sg.routes = ps[0].route != nullptr;
  if (sg.routes) {  // matvec_narrow_kernel routes, where this holds
    FRINK_CUDA_CHECK(matmul_routes_in_launch(ps[0], *ps[0].route) ? cudaSuccess : cudaErrorInvalidValue);
    sg.route = *ps[0].route;
  }
  sg.plain = true;
  sg.slots_settled = p.slots_settled;
  sg.fold = {};
  if (p.fold_out) {
    FRINK_CUDA_CHECK(p.fold_out->n == p.n_out ? cudaSuccess : cudaErrorInvalidValue);
    sg.fold = *p.fold_out;
  }
  int64_t groups = 0;
  for (int i = 0; i < n; ++i) {
    sg.plain = sg.plain && !ps[i].bias && ps[i].scale == 1.0f && !ps[i].slot_expert;
    sg.a[i] = args_of(ps[i]);
    groups += (ps[i].n_out + kSRows - 1) / kSRows;
    sg.g_end[i] = groups;
  }
  // Grid: KS warps per row pair (matvec_ksplit). (v4 filled the GPU once with the resident
  // warps, each walking several row pairs with 3 stages: slower on every product but the
  // grouped q/k/v; each warp's arithmetic, not the number of loads in flight, was then the limit.)
  const int64_t n_chunks = (p.n_in / Staged<T>::kBlockElems + Staged<T>::kBlocks - 1) / Staged<T>::kBlocks;
  // (matvec_reg_kernel, for the x8 layouts and F16 / BF16: a warp per row or row pair, whatever ksplit says.)
  constexpr bool kReg = reg_kernel_type(T);
  int ks = kReg ? 1 : p.ksplit > 0 ? p.ksplit : matvec_ksplit(n_chunks);
  // Four warps per row pair over more than one wave of resident blocks, where two warps per row
  // pair in three-stage blocks fit one: two (the 8B Q8_0 down, 2048 blocks of four warps
  // against ~1584 resident, and the BF16 wo and down). The same second, partial wave as for
  // the Q4_0 down (matvec_ksplit). Measured (H200, 8B tg128 graph, one call, alternating):
  // Q8_0 3.430 / 3.428 -> 3.343 / 3.337 ms, BF16 4.749 / 4.755 -> 4.624 / 4.608.
  if constexpr (Staged<T>::kChunk <= kThreeStageMaxChunk && !kReg)
    if (ks == 4 && p.ksplit == 0 && n_chunks >= kThreeStageMinChunks) {
      const int64_t r4 = stream_resident(reinterpret_cast<const void*>(matvec_stream_kernel<T, 1, 4, false>));
      const int64_t r2 = stream_resident(reinterpret_cast<const void*>(matvec_stream_kernel<T, 1, 2, false, 3>));
      if (groups > r4 && (groups * 2 + kSWarps - 1) / kSWarps <= r2) ks = 2;
    }
  FRINK_CUDA_CHECK(ks == 1 || ks == 2 || ks == 4 ? cudaSuccess : cudaErrorInvalidValue);
  const auto grid_x = static_cast<unsigned>((groups * ks + kSWarps - 1) / kSWarps);
  auto launch = [&](const Segs& s, dim3 g, int64_t t0, bool four) {
    StagedAct x = act_at<T>(x0, t0, p.n_in);
    if constexpr (Staged<T>::kPlain) x.x = s.a[0].x;
    const dim3 b(kSWarps * 32);
    // The kernel for (NT, KS, Rope) as template arguments from the runtime choice.
    auto go = [&](auto nt, auto rope) {
      constexpr int NT = decltype(nt)::value;
      constexpr bool R = decltype(rope)::value;
      // The narrow kernels' grid: a row pair to each sub-warp of `lanes`.
      const auto narrow_grid = [&](int lanes) {
        const int64_t warps = (groups * lanes + 31) / 32;
        return dim3(static_cast<unsigned>((warps + kSWarps - 1) / kSWarps), g.y);
      };
      if constexpr (narrow_k_lanes<T>(256) > 0 && NT == 1 && !R) {
        if (narrow_k > 0) {
          if (narrow_k == 8) launch_dependent(matvec_narrow_k_kernel<T, 8>, narrow_grid(8), b, 0, p.stream, s, x);
          else launch_dependent(matvec_narrow_k_kernel<T, 16>, narrow_grid(16), b, 0, p.stream, s, x);
          return;
        }
      }
      if constexpr (T == kQ4_0X8 && NT == 1 && R) {
        // (Adjacent pairs here instead of matvec_reg_kernel's store, without a cluster: 8B Q4_0
        // graph 1.877 / 1.877 -> 1.870 / 1.877 ms, llama3.2-1b 0.580 / 0.579 -> 0.583 / 0.582;
        // H200, one call, alternating. Left to the row-pair kernel.)
        // Neox rows the narrow rope kernel takes; a head's pairs are whole blocks of one cluster.
        const int c = s.rope.neox ? narrow_rope_cluster_of(p.n_in, s.rope.head_dim) : 0;
        if (c > 0) {
          const int lanes = narrow_rope_lanes(p.n_in), warps = narrow_rope_warps(lanes);
          const dim3 gr = cluster_grid(groups, warps * 32 / lanes, c);
          const dim3 bw(warps * 32);
          const auto uc = static_cast<unsigned>(c);
          if (lanes == 8) launch_dependent_clustered(uc, matvec_narrow_rope_kernel<8, kSWarps>, gr, bw, 0, p.stream, s, x);
          else if (lanes == 16) launch_dependent_clustered(uc, matvec_narrow_rope_kernel<16, kSWarps>, gr, bw, 0, p.stream, s, x);
          else launch_dependent_clustered(uc, matvec_narrow_rope_kernel<32, 2 * kSWarps>, gr, bw, 0, p.stream, s, x);
          return;
        }
      }
      if constexpr (kReg) {
        if constexpr (NT == 1 && !R && T == kQ4_0X8) {
          if (p.n_in <= kNarrowMaxIn) {  // matvec_narrow_kernel
            const auto narrow = [&](auto lanes, auto rk) {
              constexpr int L = decltype(lanes)::value;
              launch_dependent(matvec_narrow_kernel<T, L, decltype(rk)::value>, narrow_grid(L), b, 0, p.stream, s, x);
            };
            using L8 = std::integral_constant<int, 8>;
            using L16 = std::integral_constant<int, 16>;
            using R0 = std::integral_constant<int, 0>;
            using R4 = std::integral_constant<int, 4>;
            const bool l8 = narrow_q4_0_lanes(p.n_in) == 8;
            if (!s.routes) l8 ? narrow(L8{}, R0{}) : narrow(L16{}, R0{});
            else l8 ? narrow(L8{}, R4{}) : narrow(L16{}, R4{});
            return;
          }
        }
        if constexpr (NT == 1 && !R && (T == kQ4_0X8 || T == kQ8_0X8 || Staged<T>::kPlain)) {
          // One token without RoPE, Q4_0 / Q8_0 x8 and F16 / BF16: a warp per row with twice the
          // blocks a pass (OneRow), so a 4096-wide Q4_0 row is one memory round trip. Measured
          // (H200, graph ms per 8B decode token, one call, alternating; a row pair a warp -> a row
          // a warp): Q4_0 1.921 / 1.916 -> 1.907 / 1.900, Q8_0 2.653 / 2.654 -> 2.639 / 2.639; only
          // for grids within one wave it was between the two (1.914 / 1.910); twice the blocks a
          // pass on row pairs (no register bound) lost, Q8_0 2.690. BF16 (the stream kernel
          // before, KS 2-4 warps a row pair through shared memory) 4.569 / 4.554 -> 4.440 / 4.438
          // (4 groups of 8 elements a lane a pass; 2 gave 4.460 / 4.461), where row pairs in
          // registers lost (4.614 / 4.607 with 2 groups a pass, 4.873 / 4.871 with 4) as the
          // kernel of every BF16 launch; they stay for the rest (RoPE, four tokens): the
          // measured 4.440 ran so, and the RoPE store then adds in the order a plain product does.
          // Expert slots keep row pairs: a row a warp ran qwen3-30b-a3b Q4_0 at 2.421 / 2.422 ms a
          // token against 2.257 / 2.257 (one call, alternating). So do Q4_K and Q6_K (their
          // branches of the kernel say why).
          if constexpr (T == kQ4_0X8 || T == kQ8_0X8) {
            if (s.fold.q) {
              // matmul_folds_norm: a block of 32 rows a row a warp (one Q8_0 block of the fold, one
              // block a SM; the same warps a SM as 8 blocks of 4). Measured with the fold's readers
              // (H200, 8B tg128 graph ms, one call, two rounds; the norm launches before): 8 layers
              // Q4_0 0.552 / 0.554 -> 0.538 / 0.537, Q8_0 0.769 / 0.765 -> 0.751 / 0.757; 32 layers
              // Q4_0 1.950 -> 1.857 (tg128 494 -> 520 t/s), Q8_0 2.629 -> 2.559 (371 -> 384).
              // (KB halved lost: Q8_0 0.776 / 0.775 against 0.759 / 0.756, an earlier call.)
              const auto kernel = matvec_reg_kernel<T, 1, false, 2 * RegBlocks<T>, 1, true, 32, T, true>;
              launch_dependent(kernel, dim3(static_cast<unsigned>(p.n_out / 32)), dim3(32 * 32), 0, p.stream, s, x);
              return;
            }
          }
          if (!p.slot_expert) {
            const dim3 gr(static_cast<unsigned>((2 * groups + kSWarps - 1) / kSWarps), g.y);
            launch_dependent(matvec_reg_kernel<T, 1, false, 2 * RegBlocks<T>, 8, true>, gr, b, 0, p.stream, s, x);
            return;
          }
        }
        if constexpr (NT == 1 && R) {
          if (s.rope.neox) {  // matmul_can_rope held: reg_rope_cluster_of > 0
            const int c = reg_rope_cluster_of(s.rope.head_dim);
            const dim3 gr = cluster_grid(groups, kRegRopeWarps, c);
            // 4 blocks a SM (64 registers); Q4_K's neox kernel spilled 24 bytes there, so 3.
            constexpr int kMinB = T == kQ4_KX8 || T == kQ5_KX8 || T2 == kQ4_KX8 ? 3 : 4;
            const auto kernel = matvec_reg_kernel<T, 1, true, RegBlocks<T>, kMinB, false, kRegRopeWarps, T2>;
            launch_dependent_clustered(static_cast<unsigned>(c), kernel, gr, dim3(kRegRopeWarps * 32), 0, p.stream, s, x);
            return;
          }
        }
        launch_dependent(matvec_reg_kernel<T, NT, R, RegBlocks<T>, NT == 1 ? RegMinBlocks<T> : 0, false, kSWarps, T2>,
                         g, b, 0, p.stream, s, x);
      } else if (ks == 1) {
        // Two-chunk rows in a grid of one wave of three-stage blocks (the 8B q/k/v and wo):
        // both chunks copied before the dependency wait, so while the kernel before runs,
        // where two stages copied the second only after it. Measured (H200, 8B tg128 graph
        // time, one call, alternating): Q4_0 2.209 / 2.219 -> 2.183 / 2.181 ms, Q4_K_M 3.040 ->
        // 3.003. Larger grids (the 8B gate/up, 2.7 waves) lost: 2.231 / 2.229 ms.
        if constexpr (Staged<T>::kChunk <= kThreeStageMaxChunk) {
          if (n_chunks == 2) {
            const auto k3 = matvec_stream_kernel<T, NT, 1, R, 3>;
            if (int64_t{g.x} * g.y <= stream_resident(reinterpret_cast<const void*>(k3))) {
              launch_dependent(k3, g, b, 0, p.stream, s, x);
              return;
            }
          }
        }
        const dim3 gw(one_wave_x(reinterpret_cast<const void*>(matvec_stream_kernel<T, NT, 1, R>), g), g.y);
        launch_dependent(matvec_stream_kernel<T, NT, 1, R>, gw, b, 0, p.stream, s, x);
      } else if (ks == 2) {
        // Two chunks in flight per warp where each walks three or more (the 4-bit 8B down:
        // 7 chunks over 2 warps) and a third stage leaves the grid one wave (chunks up to
        // 1152 bytes: 27.6 KB a block, 8 a SM). Measured (H200, 8B tg128 graph time, one call,
        // alternating, with the Q8_0 bound above): Q4_0 2.357 / 2.356 -> 2.332 / 2.332 ms,
        // Q4_K_M 3.131 / 3.138 -> 3.131 / 3.131. A third stage for every split launch cost
        // Q8_0 and BF16 3% (fewer blocks resident, nothing more in flight).
        if constexpr (Staged<T>::kChunk <= kThreeStageMaxChunk) {  // no three-stage kernel for wider chunks
          if (n_chunks >= kThreeStageMinChunks) {
            launch_dependent(matvec_stream_kernel<T, NT, 2, R, 3>, g, b, 0, p.stream, s, x);
            return;
          }
        }
        launch_dependent(matvec_stream_kernel<T, NT, 2, R>, g, b, 0, p.stream, s, x);
      } else {
        launch_dependent(matvec_stream_kernel<T, NT, 4, R>, g, b, 0, p.stream, s, x);
      }
    };
    using One = std::integral_constant<int, 1>;
    using Four = std::integral_constant<int, 4>;
    if constexpr (T2 != T) {  // one token (two_type_launch)
      FRINK_CUDA_CHECK(!four ? cudaSuccess : cudaErrorInvalidValue);
      if (s.rope.pos) go(One{}, std::true_type{});
      else go(One{}, std::false_type{});
    } else if (s.rope.pos) {
      if (four) go(Four{}, std::true_type{});
      else go(One{}, std::true_type{});
    } else {
      if (four) go(Four{}, std::false_type{});
      else go(One{}, std::false_type{});
    }
  };
  if (p.slot_expert) {
    launch_rows(p, sg.a[0], grid_x,
                [&](const Args& a, dim3 g, int64_t t0, bool four) {
                  Segs s = sg;
                  for (int i = 0; i < n; ++i) s.a[i].slot0 = a.slot0;
                  launch(s, g, t0, four);
                });
    return;
  }
  for (int64_t t0 = 0; t0 < p.n_tok;) {  // launch_rows' token chunks, for every product at once
    const bool four = p.n_tok - t0 >= 4;
    Segs s = sg;
    for (int i = 0; i < n; ++i) s.a[i] = args_at(ps[i], sg.a[i], t0);
    s.rope.t0 = t0;
    launch(s, dim3(grid_x), t0, four);
    t0 += four ? 4 : 1;
  }
}

template <int T>
void matvec_stream_launch(const MatmulParams* ps, int n, const StagedAct& x0) {
  const int t2 = ps[n - 1].type;
  if constexpr (T == kQ4_KX8 || T == kQ5_KX8) {
    if (t2 != T) {
      FRINK_CUDA_CHECK(joins_two_type_launch(ps[0], t2) ? cudaSuccess : cudaErrorInvalidValue);
      if (t2 == kQ6_KX8) stream_launch<T, kQ6_KX8>(ps, n, x0);
      if constexpr (T == kQ5_KX8)
        if (t2 == kQ4_KX8) stream_launch<T, kQ4_KX8>(ps, n, x0);
      return;
    }
  }
  FRINK_CUDA_CHECK(t2 == T ? cudaSuccess : cudaErrorInvalidValue);
  stream_launch<T, T>(ps, n, x0);
}

#define FRINK_INST(T) template void matvec_launch<T>(const MatmulParams&, const Args&);
FRINK_FOR_EACH_DEVICE_TYPE(FRINK_INST)
#undef FRINK_INST
template void matvec_stream_launch<kQ4_0>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ4_0X8>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ8_0X8>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ4_KX8>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ5_KX8>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ6_KX8>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ8_0>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kMXFP4>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kMXFP4X16>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ4_K>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ5_K>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kQ6_K>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kF16>(const MatmulParams*, int, const StagedAct&);
template void matvec_stream_launch<kBF16>(const MatmulParams*, int, const StagedAct&);

}  // namespace frink::cuda::mm

namespace frink::cuda {

bool matmul_combines_in_launch(const MatmulParams& p) {
  return mm::combine_shape(p.type, p.n_in, p.n_slots).lanes > 0 && p.slot_expert && p.slots_settled && p.act_round &&
         p.combine_w && p.x_div == 1 && p.n_tok == p.n_slots && !p.bias && !p.expert_scale && p.scale == 1.0f &&
         !p.rope && !p.route && (p.type != kQ4_0X8 || mm::staged_ok(p));
}

bool matmul_ropes_neox(const MatmulParams& p, const RopeLaunch& r) {
  // The stream launch's kernel for p (matvec_stream_launch): the narrow rope kernel, or the
  // row-pair register kernel of the x8 layouts and F16 / BF16 rows.
  const bool narrow = p.type == kQ4_0X8 && mm::narrow_rope_cluster_of(p.n_in, r.head_dim) > 0;
  const bool reg = mm::reg_kernel_type(p.type);
  // Thread-block clusters: a device of sm_90 or newer running the kernels' sm_90 code (pdl_compiled).
  return p.n_tok == 1 && r.n_rot == r.head_dim && (narrow || (reg && mm::reg_rope_cluster_of(r.head_dim) > 0)) &&
         pdl_compiled(reinterpret_cast<const void*>(mm::matvec_narrow_rope_kernel<16, mm::kSWarps>));
}

bool matmul_folds_norm(const MatmulParams& p) {
  return p.n_tok == 1 && matmul_takes_folded_norm(p.type, p.n_in, false) && p.act_round && p.residual && !p.bias &&
         p.scale == 1.0f && !p.slot_expert && !p.rope && !p.combine_w && !p.route && p.n_out % 32 == 0 &&
         mm::staged_ok(p);
}

bool matmul_takes_folded_norm(int type, int64_t n_in, bool neox_rope) {
  // The stream launch's choice (stream_launch): Q4_0 rows up to kNarrowMaxIn go to the narrow
  // kernel without RoPE, and with neox RoPE to the narrow rope kernel up to 4096.
  return type == kQ8_0X8 || (type == kQ4_0X8 && n_in > mm::kNarrowMaxIn && !neox_rope);
}

bool matmul_routes_in_launch(const MatmulParams& p, const RouteParams& r) {
  return p.type == kQ4_0X8 && p.n_in <= mm::kNarrowMaxIn && p.slot_expert && p.act_round && p.n_tok == 1 && !p.rope &&
         r.n_tok == 1 && route_params_ok(r) && r.n_expert <= kRouteInLaunchMaxExperts &&
         p.n_slots == r.k + r.n_shared;
}

}  // namespace frink::cuda
