// Split-K decode attention against the mirror (attn_decode_kernel), whose partials
// attn_merge_kernel combines. Only for attention.cu (launch_attention).
#pragma once

#include "cuda/attention_parts.cuh"
#include "cuda/pdl.cuh"

namespace frink::cuda {

namespace {

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

}  // namespace

}  // namespace frink::cuda
