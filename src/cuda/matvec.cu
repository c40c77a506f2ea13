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
//   BF16 146 (with a one-pass norm). v4: the stream kernel (matvec_stream.cuh).
// The kernels: matvec_kernel here (any type), matvec_stream.cuh, matvec_reg.cuh and
// matvec_narrow.cuh (their launches' shared index space and stores: matvec_segs.cuh); the
// launches choosing among them below (stream_launch).
#include "cuda/block_dot.cuh"
#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"
#include "cuda/matvec_narrow.cuh"
#include "cuda/matvec_reg.cuh"
#include "cuda/matvec_segs.cuh"
#include "cuda/matvec_stream.cuh"
#include "cuda/occupancy.h"
#include "cuda/pdl.cuh"

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
        // alternating, with the Q8_0 launch bound of matvec_stream.cuh): Q4_0 2.357 / 2.356 -> 2.332 / 2.332 ms,
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
