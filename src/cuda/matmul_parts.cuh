// What the matrix-product files share (matmul.cu routes, act_prep.cu prepares activations,
// matvec.cu holds the decode kernels, gemm.cu the cuBLAS path): the kernels' argument block,
// the epilogue, the activation formats and the launch helpers. Only for src/cuda/*.cu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/dequant.cuh"
#include "cuda/matmul.cuh"
#include "cuda/rope.cuh"

namespace frink::cuda::mm {

struct Args {
  const uint8_t* w;
  size_t row_bytes;
  int64_t n_in, n_out, x_stride, y_stride;
  const float* x;
  float* y;
  const float* bias;
  float scale;
  bool bias_before_scale;
  const float* residual;  // matrix-vector kernels: added to y (stride y_stride; may alias y)
  // Expert products (MatmulParams::slot_expert): see select_slot.
  const int32_t* slot_expert;
  size_t expert_bytes;
  int64_t x_div;
  const float* expert_scale;
  int64_t slot0;  // the launch's first slot (grid y covers at most 65535)
};

inline Args args_of(const MatmulParams& p) {
  return {static_cast<const uint8_t*>(p.w), p.row_bytes, p.n_in, p.n_out, p.x_stride, p.y_stride,
          p.x, p.y, p.bias, p.scale, p.bias_before_scale, p.residual,
          p.slot_expert, p.expert_bytes, p.x_div, p.expert_scale, 0};
}

// Expert mode (a.slot_expert set): the block's grid row blockIdx.y is slot s. Points a at
// expert slot_expert[s]'s matrix, bias row and scale and at output row s, and returns the
// activation row the slot reads (s / x_div). Otherwise returns 0 and changes nothing.
// e: the slot's expert, where the kernel has it already (the narrow kernel's routing).
__device__ __forceinline__ int64_t select_slot(Args& a, int64_t e) {
  if (!a.slot_expert) return 0;
  const int64_t s = a.slot0 + blockIdx.y;
  a.w += e * a.expert_bytes;
  a.y += s * a.y_stride;
  if (a.bias) a.bias += e * a.n_out;
  if (a.expert_scale) a.scale = a.expert_scale[e];
  return s / a.x_div;
}
__device__ __forceinline__ int64_t select_slot(Args& a) {
  return a.slot_expert ? select_slot(a, a.slot_expert[a.slot0 + blockIdx.y]) : 0;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float epilogue(const Args& a, int64_t row, float v) {
  const float b = a.bias ? a.bias[row] : 0.0f;
  if (a.bias_before_scale) return (v + b) * a.scale;
  return v * a.scale + b;
}

// What y[t][row] becomes for the reduced sum v: the epilogue, plus the residual. Read before
// y is written: they may be the same element.
__device__ __forceinline__ float final_value(const Args& a, int64_t row, int t, float v) {
  return a.residual ? epilogue(a, row, v) + a.residual[t * a.y_stride + row] : epilogue(a, row, v);
}

// The end of every matrix-vector kernel: a warp's NT partial sums of one row, reduced across
// the lanes, through the epilogue into y.
template <int NT>
__device__ __forceinline__ void store_row(const Args& a, int64_t row, const float (&acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (threadIdx.x % 32 == 0) a.y[t * a.y_stride + row] = final_value(a, row, t, v);
  }
}

// The host's activation formats (quant/quant.h vec_dot_type), emulated value for value:
// kQ8Blocks = quantize_q8_0/q8_1 then dequantize (d rounded to f16), kQ8K = quantize_q8_k.
// kActDp4a: x quantized to int8 Q8_0 blocks plus f32 scales for the dp4a kernel;
// kActDp4aK: to int8 Q8_K blocks (f32 scale per 256, int sums per 32) for the K-quant one.
enum ActRound { kActNone, kActQ8Blocks, kActQ8K, kActF16, kActBF16, kActDp4a, kActDp4aK };

// Elements of one block of x's Q8 preparation: kActQ8Blocks / kActDp4a 32, kActQ8K /
// kActDp4aK 256 (the widths those launches need a multiple of).
constexpr int64_t act_block_elems(ActRound kind) { return kind == kActQ8Blocks || kind == kActDp4a ? 32 : 256; }

// Whether one one-token launch of matvec_reg_kernel takes products of types t and t2
// (launch_matmuls groups them, t's products first): K-quant tiles, one Q8_K x, as Q4_K_M /
// Q5_K_M files mix them within a layer (a Q6_K v after Q4_K or Q5_K q/k; qwen3-next's Q5_K qkv
// before its Q4_K z and gates).
__host__ __device__ constexpr bool two_type_launch(int t, int t2) {
  return ((t == kQ4_KX8 || t == kQ5_KX8) && t2 == kQ6_KX8) || (t == kQ5_KX8 && t2 == kQ4_KX8);
}
// Whether products of type t2 may share p's launch that way (one token, no experts).
inline bool joins_two_type_launch(const MatmulParams& p, int t2) {
  return two_type_launch(p.type, t2) && p.n_tok == 1 && !p.slot_expert;
}

// The types whose matrix-vector kernels read x quantized for dp4a (matvec.cu's stream and
// register kernels): as int8 Q8_0 blocks (kActDp4a), or as Q8_K blocks (kActDp4aK); kActNone otherwise.
__host__ __device__ constexpr ActRound dp4a_act_for(int type) {
  switch (type) {
    case kQ4_0: case kQ4_0X8: case kQ8_0: case kQ8_0X8: case kMXFP4: case kMXFP4X16: return kActDp4a;
    case kQ4_K: case kQ4_KX8: case kQ5_K: case kQ5_KX8: case kQ6_K: case kQ6_KX8: return kActDp4aK;
    default: return kActNone;
  }
}

constexpr ActRound act_round_for(int type) {
  switch (type) {
    case kQ4_0: case kQ4_0X8: case kQ5_0: case kQ8_0: case kQ8_0X8: case kIQ4_NL: case kMXFP4: case kMXFP4X16:
    case kQ4_1: case kQ5_1:
      return kActQ8Blocks;
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ4_KX8: case kQ5_K: case kQ5_KX8: case kQ6_K: case kQ6_KX8:
    case kIQ4_XS:
      return kActQ8K;
    case kF16: return kActF16;
    case kBF16: return kActBF16;
    default: return kActNone;
  }
}

inline int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 4));
}

// a0 for activation rows t0 on (x, y and residual advanced t0 rows).
inline Args args_at(const MatmulParams& p, Args a0, int64_t t0) {
  a0.x = p.x + t0 * p.x_stride;
  a0.y = p.y + t0 * p.y_stride;
  a0.residual = p.residual ? p.residual + t0 * p.y_stride : nullptr;
  return a0;
}

// The launches of a matrix-vector product, for every kernel family: f(args, grid, t0, four)
// launches once with activation row t0 and four (NT 4) or one (NT 1) token rows. Decode
// batches go four tokens at a time, then one; expert mode (one activation row per slot) in
// chunks of slots that grid y can hold, NT 1.
template <typename F>
void launch_rows(const MatmulParams& p, const Args& a0, unsigned grid_x, F f) {
  if (p.slot_expert) {
    constexpr int64_t kMaxY = 65535;
    for (int64_t s0 = 0; s0 < p.n_slots; s0 += kMaxY) {
      Args a = a0;
      a.slot0 = s0;
      f(a, dim3(grid_x, static_cast<unsigned>(std::min(kMaxY, p.n_slots - s0))), int64_t{0}, false);
    }
    return;
  }
  for (int64_t t0 = 0; t0 < p.n_tok;) {
    const bool four = p.n_tok - t0 >= 4;
    f(args_at(p, a0, t0), dim3(grid_x), t0, four);
    t0 += four ? 4 : 1;
  }
}

// dp4a path for Q4_K and Q6_K (the types of a Q4_K_M file), used when act_round is given: x is
// quantized once per matmul to int8 Q8_K blocks with the host's rule (iscale = -127 / the
// signed value of largest magnitude, q = min(127, rint(iscale x)), d = 1 / iscale), and the
// kernels do the host's vec_dot_q4_K_q8_K / q6_K_q8_K arithmetic: integer dots per sub-block
// weighted by the integer sub-block scales, one float scale per super-block, Q4_K's min term
// from the activation's per-32 sums. v1 (the generic kernel: dequantize to f32, round x to
// Q8_K values in f32, f32 FMAs) read 4 bytes of activation per weight element.
//
// Activation layout in act_round: matmul.cuh Q8KAct.

// The activation each family reads: int8 Q8_0 blocks (Q4_0, Q8_0), Q8_K blocks (Q4_K, Q6_K)
// or f32 rows already rounded to the weights' 16-bit format (F16, BF16).
struct StagedAct {
  const int8_t* q8;
  const float* d8;
  Q8KAct q8k;
  const float* x;
  // A folded norm's input (MatmulParams::fold_in; one token): q8 / d8 hold w * x's blocks, and
  // each row's sum is scaled by rsqrt(sum(fold.parts) / fold.n + fold.eps). Null parts: no fold.
  NormFold fold{};
};

// Products of one input a stream launch holds at most (q/k/v).
constexpr int kMaxSegs = 3;

// Which of r's tensors product p writes (MatmulParams::rope), told by its output buffer.
enum class RopeRole { kNone, kQ, kK, kV };
inline RopeRole rope_role(const RopeLaunch& r, const MatmulParams& p) {
  if (!p.y) return RopeRole::kNone;
  return p.y == r.x ? RopeRole::kQ : p.y == r.x2 ? RopeRole::kK : p.y == r.v ? RopeRole::kV : RopeRole::kNone;
}

// act_prep.cu: x rounded to the host's activation format (kind), or quantized for the dp4a
// kernels (xq int8 [n_tok][n_in] then xd f32 [n_tok][n_in / 32]; Q8_K as Q8KAct). With x16
// (Q8 and Q8_K rounding only), the rounded values go there as f16 [n_tok][n_in] instead of into
// act_round: the copy of x a quantized product on cuBLAS reads (gemm.cu's x_16bit).
void launch_act_round(const MatmulParams& p, ActRound kind, __half* x16 = nullptr);
void launch_quantize_q8(const MatmulParams& p, int8_t* xq, float* xd);
void launch_quantize_q8k(const MatmulParams& p, const Q8KAct& x);
// The norm np and its output quantized as launch_quantize_q8 / _q8k would, in one kernel
// (np's rows must suit the vector norm: norm_vec_ok, width a multiple of 32 / 256).
void launch_norm_q8(const NormParams& np, int8_t* xq, float* xd);
void launch_norm_q8k(const NormParams& np, const Q8KAct& x);
// The norm np (one row) as kind 0 (launch_norm), 1 (launch_norm_q8 into q8_0_act(p)), 2
// (launch_norm_q8k into q8k_act(p)), 3 or 4 (launch_norm_round into p.act_round, f16 or bf16),
// with router r's product of its output in the same launch.
void launch_norm_router(const NormParams& np, int kind, const MatmulParams& p, const RouterNormParams& r);
// The gated activation g (written to g.out as launch_glu would) and its quantization, likewise.
void launch_glu_q8(const GluParams& g, int8_t* xq, float* xd);
void launch_glu_q8k(const GluParams& g, const Q8KAct& x);
// The norm np (norm_vec_ok) or the gated activation g (n a multiple of 256 with an up norm),
// written as launch_norm / launch_glu would, and rounded to f16 or bf16 into out [rows][n] as
// launch_act_round would: one launch fewer before an F16 / BF16 decode product.
void launch_norm_round(const NormParams& np, bool bf16, float* out);
void launch_glu_round(const GluParams& g, bool bf16, float* out);
// The same two, with x's 16-bit copy (bf16 or f16 values, [rows][n]) as out: what an F16 /
// BF16 product on cuBLAS reads (gemm.cu's x_16bit), one pass over x fewer. The GLU's f32
// values (g.out) are not written: the copy is all its product reads.
void launch_norm_16bit(const NormParams& np, bool bf16, void* out);
// The norm np (norm_vec_ok, width a multiple of the block) written as launch_norm would, and
// its Q8 (kind kActQ8Blocks) or Q8_K rounding as f16 into out [rows][n]: the copy a quantized
// product on cuBLAS reads, as launch_act_round writes it with x16.
void launch_norm_blocks_16bit(const NormParams& np, ActRound kind, __half* out);
// p's x itself as that 16-bit copy: gemm.cu's conversion where no producer wrote it.
void launch_x_16bit(const MatmulParams& p, bool bf16, void* out);
void launch_glu_16bit(const GluParams& g, bool bf16, void* out);
// The gated activation g (no up norm) rounded as launch_act_round(kind) would with x16: the
// f16 copy a quantized down product on cuBLAS reads; g.out is not written.
void launch_glu_blocks_16bit(const GluParams& g, ActRound kind, __half* out);

// matvec.cu: decode-sized products. staged_ok: W's rows suit the stream kernel.
bool staged_ok(const MatmulParams& p);
template <int T>
void matvec_launch(const MatmulParams& p, const Args& a0);  // the generic kernel, any type
// Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (and their x8 forms), MXFP4, F16, BF16.
template <int T>
void matvec_stream_launch(const MatmulParams* ps, int n, const StagedAct& x0);

// gemm.cu: larger batches through cuBLAS. x_ready: x's 16-bit copy is already in the scratch.
template <int T>
void gemm_launch(const MatmulParams& p, const Args& a, bool x_ready);

}  // namespace frink::cuda::mm
