// Matrix products for the device path (see matmul.cuh): which kernel family takes each
// product, and the grouping of products of one input. The kernels: matvec.cu (decode),
// gemm.cu (cuBLAS), act_prep.cu (activation rounding and quantization).
#include "cuda/matmul.cuh"

#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"
#include "cuda/moe.cuh"
#include "cuda/norm_row.cuh"
#include "cuda/occupancy.h"

namespace frink::cuda {

using namespace mm;

namespace {

// The matrix-vector kernels serve decode batches and every expert product (one activation
// row per slot); other batches go to cuBLAS.
bool takes_matvec(const MatmulParams& p) {
  return !p.group_rows && !p.head_batch && (p.slot_expert || p.matvec_only || p.n_tok <= kMatvecMaxTok);
}

// Whether p takes cuBLAS with F16 / BF16 weights: x in their 16-bit format at the scratch's
// start (gemm.cu's x_16bit), written by its producer (launch_norm_16bit, launch_glu_16bit) or
// converted there by gemm_launch.
bool reads_scratch16(const MatmulParams& p);

// What x becomes before the kernels read it: the key under which a group of products on one
// input (launch_matmuls) prepares it once.
ActRound act_prep_for(const MatmulParams& p) {
  if (!p.act_round) return kActNone;
  const ActRound dp4a = dp4a_act_for(p.type);
  if (dp4a != kActNone && takes_matvec(p) && p.n_in % act_block_elems(dp4a) == 0) return dp4a;
  return act_round_for(p.type);
}

bool reads_scratch16(const MatmulParams& p) {
  const ActRound kind = act_prep_for(p);
  return (kind == kActF16 || kind == kActBF16) && !takes_matvec(p);
}

// Whether p's scratch has room for x's 16-bit copy at its start.
bool scratch_fits_x(const MatmulParams& p) {
  return p.scratch && p.scratch_elems >= static_cast<size_t>(p.n_in * p.n_tok);
}

// Whether p, a quantized type on cuBLAS, reads x's Q8 / Q8_K rounding as the f16 copy at the
// scratch's start (gemm.cu's x_16bit), written by the rounding launch (launch_act_round's x16)
// or the GLU before it (launch_glu_blocks_16bit), where the rounded f32 copy and a conversion
// of it were two passes (3.8 ms of an 8B Q4_0 pp512 batch's 30 ms of kernels, H200 ncu).
bool rounds_to_scratch(const MatmulParams& p) {
  const ActRound kind = act_prep_for(p);
  return (kind == kActQ8Blocks || kind == kActQ8K) && !takes_matvec(p) && scratch_fits_x(p);
}

// Whether p goes to the stream kernel (matvec_stream_kernel): one of its types on the
// matrix-vector path, rows it can stage. Consecutive such products of one type share a launch.
bool streams(const MatmulParams& p, ActRound kind) {
  const bool family = (kind != kActNone && dp4a_act_for(p.type) == kind) ||
                      ((p.type == kF16 || p.type == kBF16) && takes_matvec(p));
  return family && staged_ok(p);
}

// Whether dispatch runs p on the stream kernel: streams() of p as dispatch hands it on (F16 and
// BF16 on the matrix-vector path read x's rounded copy in act_round when there is one).
bool on_stream_kernel(const MatmulParams& p) {
  const ActRound kind = act_prep_for(p);
  MatmulParams q = p;
  if ((kind == kActF16 || kind == kActBF16) && takes_matvec(p)) {
    q.x = p.act_round;
    q.x_stride = p.n_in;
  }
  return streams(q, kind);
}

// Products ps[0, n) of one type and one activation preparation (n > 1 only when all stream).
// x_ready: the previous product of the group prepared x the same way (kind, path, 16-bit
// format), so the act_round buffer holds it (on the cuBLAS path: the 16-bit copy of x in the
// scratch; F16/BF16 there skip act_round).
// fold: the group's MatmulParams::fold_in (x_ready then holds).
template <int T>
void dispatch(const MatmulParams* ps, int n, ActRound kind, bool x_ready, const NormFold* fold) {
  MatmulParams p = ps[0];
  if constexpr (dp4a_act_for(T) == kActDp4a) {
    if (kind == kActDp4a) {
      const Q8_0Act x = q8_0_act(p);
      if (!x_ready) launch_quantize_q8(p, x.q, x.d);
      StagedAct a{x.q, x.d, {}, nullptr};
      if (fold) a.fold = *fold;
      matvec_stream_launch<T>(ps, n, a);
      return;
    }
  }
  FRINK_CUDA_CHECK(!fold ? cudaSuccess : cudaErrorInvalidValue);  // (launch_matmuls checked it)
  if constexpr (dp4a_act_for(T) == kActDp4aK) {
    if (kind == kActDp4aK) {
      const Q8KAct x = q8k_act(p);
      if (!x_ready) launch_quantize_q8k(p, x);
      matvec_stream_launch<T>(ps, n, StagedAct{nullptr, nullptr, x, nullptr});
      return;
    }
  }
  // The cuBLAS path of F16/BF16 weights converts x to their 16-bit format itself, which is the
  // same rounding: a rounded f32 copy first would be one more pass over x.
  const bool converts_itself = reads_scratch16(p);
  // act_round is left as it was where the rounding goes to the scratch: nothing else reads it.
  const bool to_scratch = rounds_to_scratch(p);
  if (kind != kActNone && !converts_itself) {
    if (!x_ready) launch_act_round(p, kind, to_scratch ? static_cast<__half*>(p.scratch) : nullptr);
    p.x = p.act_round;
    p.x_stride = p.n_in;
  }
  if constexpr (T == kF16 || T == kBF16) {
    if (streams(p, kind)) {
      MatmulParams group[kMaxSegs];
      for (int i = 0; i < n; ++i) {
        group[i] = ps[i];
        group[i].x = p.x;
        group[i].x_stride = p.x_stride;
      }
      matvec_stream_launch<T>(group, n, StagedAct{nullptr, nullptr, {}, p.x});
      return;
    }
  }
  const Args a = args_of(p);
  if (takes_matvec(p))
    matvec_launch<T>(p, a);
  else
    gemm_launch<T>(p, a, x_ready || to_scratch);
}

}  // namespace

bool matmul_supported(int type) {
#define FRINK_CASE(T) if (type == T) return true;
  FRINK_FOR_EACH_DEVICE_TYPE(FRINK_CASE)
#undef FRINK_CASE
  return false;
}

size_t matmul_scratch_elems(int64_t n_in, int64_t n_tok) {
  // x in f16 plus weight tiles of up to 64 Mi elements (128 MiB), at least one row.
  return static_cast<size_t>(n_in * n_tok) + std::max<size_t>(static_cast<size_t>(n_in), size_t{64} << 20);
}

bool matmul_reads_q8_0(const MatmulParams& p) { return act_prep_for(p) == kActDp4a; }

bool matmul_adds_residual(const MatmulParams& p) {
  if (p.combine_w) return matmul_combines_in_launch(p);  // its one row's residual
  if (!p.residual || p.slot_expert || p.group_rows) return false;
  return p.n_tok <= kMatvecMaxTok || (p.residual == p.y && !p.bias && p.scale == 1.0f);
}

bool matmul_reads_rounded16(const MatmulParams& p) {
  const ActRound kind = act_prep_for(p);
  return (kind == kActF16 || kind == kActBF16) && takes_matvec(p);
}

bool matmul_reads_q8_blocks(const MatmulParams& p) {
  const ActRound kind = act_prep_for(p);
  return kind == kActDp4a || kind == kActDp4aK;
}

size_t matmul_q8_blocks_bytes(int64_t n_in, int64_t n_tok) {
  const auto n = static_cast<size_t>(n_tok * n_in), rows = static_cast<size_t>(n_tok);
  // q8_0_act: int8 quants, f32 scale per 32. q8k_act: int8 quants, f32 scale per 256, int32
  // sum per 32.
  const size_t q8_0 = n + rows * static_cast<size_t>(n_in / 32) * sizeof(float);
  const size_t q8k = n + rows * static_cast<size_t>(n_in / 256) * sizeof(float) +
                     rows * static_cast<size_t>(n_in / 32) * sizeof(int32_t);
  return std::max(q8_0, q8k);
}

// The producer of x (launch_matmuls: ps[0]'s), fused with x's preparation when p's is a dp4a
// quantization the fused kernels cover or an F16 / BF16 decode product's rounding; true when
// act_round then holds x prepared.
// Routers of fewer rows than SMs only: each row's block then has an SM of its own (kFewRows'
// reason in matvec.cu). qwen3-next's 512 rows (513 blocks of 512 threads, four an SM, each
// norming x again) lost: 8 layers, Q4_K_M, graph 0.874 / 0.878 -> 0.882 / 0.882 ms (H200).
bool norm_router_ok(const MatmulParams& p, const RouterNormParams& r) {
  if (!p.pre_norm || p.pre_glu) return false;
  const NormParams& np = *p.pre_norm;
  return !np.layer_norm && !np.b && np.w && np.n_rows == 1 && np.y != np.x && norm_vec_ok(np) && np.n == r.n_embd &&
         r.w && reinterpret_cast<uintptr_t>(r.w) % 16 == 0 && r.logits && r.n_expert > 0 && r.n_expert < sm_count();
}

bool launch_matmul_producer(const MatmulParams& p, const RouterNormParams* router) {
  FRINK_CUDA_CHECK(p.pre_norm || p.pre_glu ? cudaSuccess : cudaErrorInvalidValue);
  FRINK_CUDA_CHECK(!router || norm_router_ok(p, *router) ? cudaSuccess : cudaErrorInvalidValue);
  const ActRound kind = act_prep_for(p);  // kActDp4a(K) implies act_round is set (q8_0_act, q8k_act)
  // F16 / BF16 decode products read x rounded in act_round (dispatch); the producer writes it in
  // its own launch, one act_round launch fewer (8B BF16 graph 4.384 / 4.396 -> 4.256 / 4.267 ms,
  // H200, one call, alternating).
  const bool rounds16 = matmul_reads_rounded16(p);
  // F16 / BF16 products on cuBLAS read x's 16-bit copy at the scratch's start: the producer
  // writes it beside x, where gemm_launch's conversion was one more pass over x (then a kernel
  // of its own, to_16bit: 1.6 ms of an 8B BF16 pp512 batch's 18.4 ms of kernels, H200 ncu).
  const bool writes16 = reads_scratch16(p) && scratch_fits_x(p);
  if (p.pre_norm) {
    const NormParams& np = *p.pre_norm;
    FRINK_CUDA_CHECK(np.y == p.x && np.y_stride == p.x_stride && np.n == p.n_in && np.n_rows == p.n_tok &&
                             np.stream == p.stream && !p.pre_glu
                         ? cudaSuccess
                         : cudaErrorInvalidValue);
    if (kind == kActDp4a && norm_vec_ok(np) && np.n % 32 == 0) {
      if (router) launch_norm_router(np, 1, p, *router);
      else launch_norm_q8(np, q8_0_act(p).q, q8_0_act(p).d);
      return true;
    }
    if (kind == kActDp4aK && norm_vec_ok(np) && np.n % 256 == 0) {
      if (router) launch_norm_router(np, 2, p, *router);
      else launch_norm_q8k(np, q8k_act(p));
      return true;
    }
    if (writes16 && !router && norm_vec_ok(np)) {
      launch_norm_16bit(np, kind == kActBF16, p.scratch);
      return true;
    }
    if (rounds_to_scratch(p) && !router && norm_vec_ok(np) && np.n % act_block_elems(kind) == 0) {
      launch_norm_blocks_16bit(np, kind, static_cast<__half*>(p.scratch));
      return true;
    }
    const bool round = rounds16 && norm_vec_ok(np);
    if (router) launch_norm_router(np, round ? (kind == kActBF16 ? 4 : 3) : 0, p, *router);
    else if (round) launch_norm_round(np, kind == kActBF16, p.act_round);
    else launch_norm(np);
    return round;
  }
  const GluParams& g = *p.pre_glu;
  FRINK_CUDA_CHECK(g.out == p.x && p.x_stride == g.n && g.n == p.n_in && g.n_tok == p.n_tok && g.stream == p.stream
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  if (kind == kActDp4a && g.n % 32 == 0) {
    launch_glu_q8(g, q8_0_act(p).q, q8_0_act(p).d);
    return true;
  }
  if (kind == kActDp4aK && g.n % 256 == 0) {
    launch_glu_q8k(g, q8k_act(p));
    return true;
  }
  if (rounds16 && (!g.up_norm_w || glu_norm_ok(g))) {
    launch_glu_round(g, kind == kActBF16, p.act_round);
    return true;
  }
  if (writes16 && (!g.up_norm_w || glu_norm_ok(g))) {
    launch_glu_16bit(g, kind == kActBF16, p.scratch);
    return true;
  }
  if (rounds_to_scratch(p) && !g.up_norm_w && g.n % act_block_elems(kind) == 0) {
    launch_glu_blocks_16bit(g, kind, static_cast<__half*>(p.scratch));
    return true;
  }
  launch_glu(g);
  return false;
}

bool matmul_can_rope(const MatmulParams* ps, int n, const RopeLaunch& r) {
  // (QK-norm only before neox halves, in the fused kernel's form: no norm bias.)
  if ((r.qk_norm && (!r.neox || !rope_norm_fuses(r) || r.norm_x.b || r.norm_x2.b)) || !r.pos || !r.x || !r.x2 ||
      !r.v || !r.mirror_k || !r.mirror_v || !r.stage_k || !r.stage_v || r.head_dim % 2 != 0 || r.n_rot <= 0 ||
      r.n_rot % 2 != 0 || r.n_rot > r.head_dim)
    return false;
  const auto bit = [](RopeRole role) { return 1u << static_cast<int>(role); };
  unsigned seen = 0;  // the roles found
  int64_t pairs = 0;  // row pairs of the products before ps[i] (the launch's index space)
  for (int i = 0; i < n; ++i) {
    const MatmulParams& p = ps[i];
    const RopeRole role = rope_role(r, p);
    const int64_t start = pairs;
    pairs += (p.n_out + 1) / 2;
    // Neox: every product on a kernel with the neox store, and q and k on clusters of whole heads.
    if (r.neox && (!matmul_ropes_neox(p, r) || (role != RopeRole::kV && start % (r.head_dim / 2) != 0))) return false;
    if (role == RopeRole::kNone) continue;
    const int64_t width = role == RopeRole::kQ ? r.n_head * r.head_dim
                          : role == RopeRole::kK ? r.n_head2 * r.head_dim
                                                 : r.v_width;
    const int64_t stride = role == RopeRole::kQ ? r.row_stride : role == RopeRole::kK ? r.row_stride2 : r.v_width;
    if ((seen & bit(role)) != 0 || p.n_out != width || p.y_stride != stride || p.n_tok != r.n_tok ||
        p.n_tok > kMatvecMaxTok || p.slot_expert || p.stream != r.stream || !on_stream_kernel(p))
      return false;
    seen |= bit(role);
  }
  return seen == (bit(RopeRole::kQ) | bit(RopeRole::kK) | bit(RopeRole::kV));
}

// MatmulParams::rope as the caller must set it: on each product of r (one r), where
// matmul_can_rope holds.
static bool rope_marks_ok(const MatmulParams* ps, int n) {
  const RopeLaunch* r = nullptr;
  for (int i = 0; i < n; ++i) r = ps[i].rope ? ps[i].rope : r;
  if (!r) return true;
  for (int i = 0; i < n; ++i)
    if (ps[i].rope != (rope_role(*r, ps[i]) != RopeRole::kNone ? r : nullptr)) return false;
  return matmul_can_rope(ps, n, *r);
}

void launch_matmuls(const MatmulParams* ps, int n) {
  FRINK_CUDA_CHECK(rope_marks_ok(ps, n) ? cudaSuccess : cudaErrorInvalidValue);
  ActRound prev = kActNone;
  int prev_copy16 = 0;
  bool prev_matvec = false;
  for (int i = 0; i < n; ++i) {
    const MatmulParams& p = ps[i];
    const MatmulParams& p0 = ps[0];
    FRINK_CUDA_CHECK(p.n_in > 0 && p.n_out > 0 && p.n_tok > 0 && p.x_stride >= p.n_in && p.y_stride >= p.n_out &&
                             (!p.residual || matmul_adds_residual(p)) &&
                             (!p.combine_w || (n == 1 && matmul_combines_in_launch(p))) &&
                             (!p.group_rows || (!p.slot_expert && p.n_expert > 0 && p.group_ptrs)) &&
                             (!p.head_batch || (!p.slot_expert && !p.group_rows && p.n_tok % p.head_batch == 0)) &&
                             (!p.slot_expert || (p.n_slots > 0 && p.x_div >= 1 &&
                                                 p.n_tok == (p.n_slots + p.x_div - 1) / p.x_div)) &&
                             p.x == p0.x && p.x_stride == p0.x_stride && p.n_in == p0.n_in && p.n_tok == p0.n_tok &&
                             p.act_round == p0.act_round && p.scratch == p0.scratch && p.stream == p0.stream
                         ? cudaSuccess
                         : cudaErrorInvalidValue);
    FRINK_CUDA_CHECK(i == 0 || (!p.pre_norm && !p.pre_glu && !p.x_prepared) ? cudaSuccess : cudaErrorInvalidValue);
  }
  // x_prepared: x's producer wrote the Q8_0 / Q8_K blocks or the rounded copy already (one
  // producer of x, never two).
  FRINK_CUDA_CHECK(!ps[0].x_prepared || (!ps[0].pre_norm && !ps[0].pre_glu &&
                                         (matmul_reads_q8_blocks(ps[0]) || matmul_reads_rounded16(ps[0])))
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  // fold_in: x is the fold's Q8_0 blocks, for every product of the group (stream_launch checks
  // each one's kernel).
  const NormFold* fold = ps[0].fold_in;
  if (fold)
    for (int i = 0; i < n; ++i)
      FRINK_CUDA_CHECK(ps[0].x_prepared && ps[i].act_round == reinterpret_cast<const float*>(fold->q) &&
                               fold->n == ps[i].n_in && act_prep_for(ps[i]) == kActDp4a && (i == 0 || !ps[i].fold_in)
                           ? cudaSuccess
                           : cudaErrorInvalidValue);
  const bool first_ready =
      ps[0].x_prepared || ((ps[0].pre_norm || ps[0].pre_glu) && launch_matmul_producer(ps[0]));
  for (int i = 0; i < n; ++i) {
    const MatmulParams& p = ps[i];
    // Ready: the previous product prepared x the same way: same kind, same path, and the same
    // 16-bit copy of x left in the scratch by the cuBLAS path (copy16: none for F32 weights,
    // which take x as it is; bf16 for BF16; f16 for all others). The path is part of the key:
    // a matrix-vector product (matvec_only in a prefill group) leaves no 16-bit copy, and a
    // cuBLAS product after it read stale scratch (found by the delta-net work: NMSE 2).
    const ActRound kind = act_prep_for(p);
    const int copy16 = p.type == kF32 ? 0 : p.type == kBF16 ? 2 : 1;
    const bool matvec = takes_matvec(p);
    const bool x_ready = i == 0 ? first_ready : kind == prev && copy16 == prev_copy16 && matvec == prev_matvec;
    prev = kind;
    prev_copy16 = copy16;
    prev_matvec = matvec;
    // The run of products this launch takes: p alone, or with the next ones of its type
    // when all stream (their rows share one launch).
    int run = 1;
    // (Each product's own preparation: a matvec_only product streams, the cuBLAS ones after
    // it do not, though their types match.)
    // Expert products group when they follow the same routing (a MoE layer's gate and up:
    // one launch instead of two, 7 us each for qwen3-30b-a3b decode).
    const auto same_slots = [&](const MatmulParams& q) {
      return q.slot_expert == p.slot_expert && q.slots_settled == p.slots_settled &&
             (!p.slot_expert || (q.n_slots == p.n_slots && q.x_div == p.x_div));
    };
    // A second type joins after p's where matvec_reg_kernel takes both in one launch
    // (two_type_launch: one token, no experts): Q4_K_M's Q6_K v after its Q4_K q/k, qwen3-next's
    // Q4_K z and gates after its Q5_K qkv. Measured (H200, tg128 graph ms a token, 8 layers, one
    // call, two rounds alternating with the launch a type): llama3.1-8b Q4_K_M 0.633 / 0.631 ->
    // 0.612 / 0.613, Q5_K_M 0.683 / 0.686 -> 0.666 / 0.666, qwen3-next-80b-a3b Q4_K_M 0.510 /
    // 0.510 -> 0.497 / 0.498; logits bit for bit.
    int t = p.type;
    if (streams(p, kind))
      while (run < kMaxSegs && i + run < n && same_slots(ps[i + run]) && act_prep_for(ps[i + run]) == kind &&
             streams(ps[i + run], kind) && takes_matvec(ps[i + run]) == takes_matvec(p)) {
        const int tq = ps[i + run].type;
        if (tq != t && !(t == p.type && joins_two_type_launch(p, tq))) break;
        t = tq;
        ++run;
      }
#define FRINK_CASE(T)                      \
  if (p.type == T) {                       \
    dispatch<T>(ps + i, run, kind, x_ready, fold); \
    i += run - 1;                          \
    continue;                              \
  }
    FRINK_FOR_EACH_DEVICE_TYPE(FRINK_CASE)
#undef FRINK_CASE
    FRINK_CUDA_CHECK(cudaErrorInvalidValue);  // no kernel: the caller skipped matmul_supported
  }
}

void launch_matmul(const MatmulParams& p) { launch_matmuls(&p, 1); }

}  // namespace frink::cuda
