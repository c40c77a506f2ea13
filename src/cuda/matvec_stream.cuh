// The stream kernel (rows through shared memory by cp.async, KS warps a row pair) and the direct
// kernel for rows it cannot copy. Only for matvec.cu (its launches: stream_launch).
#pragma once

#include <cuda_pipeline.h>

#include "cuda/block_dot.cuh"
#include "cuda/matvec_segs.cuh"

namespace frink::cuda::mm {

namespace {

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
constexpr int kStages = 2;  // items per warp in shared memory (S): S - 1 in flight; 3 in two cases (stream_launch)
// Chunks up to this many bytes also have a three-stage kernel (27.6 KB a block, 8 a SM).
constexpr int kThreeStageMaxChunk = 1152;
// KS == 2 launches of rows of this many chunks or more take it (matvec_stream_launch).
constexpr int64_t kThreeStageMinChunks = 5;

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

}  // namespace

}  // namespace frink::cuda::mm
