// Y = W X for a batch of activation rows, W in its GGUF block format on the device.
// Decode-sized batches (n_tok <= kMatvecMaxTok) go to the matrix-vector kernels, which read
// each weight once and dequantize inside the kernel; larger batches call cuBLAS (f32
// accumulation): F16 and BF16 weights as they are, with x in their format; other types
// dequantized in row tiles to f16.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/elementwise.cuh"
#include "cuda/norm.cuh"

namespace frink::cuda {

struct RouteParams;  // moe.cuh

struct RopeLaunch;  // rope.cuh

inline constexpr int64_t kMatvecMaxTok = 8;

// An RMS norm folded into the products around it (one decode token; no norm launch between
// them). 1/rms is one scalar of the row, so W (w * x / rms) = (W (w * x)) / rms: the product
// that writes x (fold_out; y = residual + W h) also stores the Q8_0 blocks of w * x (no 1/rms;
// each block's scale unrounded) and each 32-row block's sum of x^2; the products that read the
// norm's output (fold_in, with x_prepared) sum the parts to 1/rms and dot those quants with each
// block's scale times 1/rms rounded to f16: the host's blocks of the normed row, up to the
// rounding of 1/rms and of the products before the scale-free rule (a rare quant or f16 step).
// Why: the norm launch costs 2.6-3.0 us on an 8B layer's chain (H200, marginal in the token
// graph), for a 1-block kernel of a 16 KB row.
struct NormFold {
  const float* w = nullptr;  // the norm's weights [n]
  int8_t* q = nullptr;       // q8_0_act's layout at q: quants [n], then f32 scales [n / 32] (unrounded)
  float* parts = nullptr;    // [n / 32] sums of x^2, one per 32-row block
  int64_t n = 0;
  float eps = 0.0f;
  __host__ __device__ float* d() const { return reinterpret_cast<float*>(q + n); }
};
// Bytes of a NormFold's buffer for rows of n (q, d, then parts).
inline size_t norm_fold_bytes(int64_t n) { return static_cast<size_t>(n) + 2 * sizeof(float) * static_cast<size_t>(n / 32); }
inline NormFold norm_fold_at(void* buf, const float* w, int64_t n, float eps) {
  NormFold f;
  f.w = w;
  f.q = static_cast<int8_t*>(buf);
  f.n = n;
  f.parts = f.d() + n / 32;  // (d() reads n)
  f.eps = eps;
  return f;
}

struct MatmulParams {
  int type = 0;                 // ggml type id of W
  const void* w = nullptr;      // [n_out] rows of row_bytes
  size_t row_bytes = 0;
  int64_t n_in = 0, n_out = 0;
  const float* x = nullptr;     // [n_tok][x_stride], x_stride >= n_in
  int64_t x_stride = 0;
  float* y = nullptr;           // [n_tok][y_stride]
  int64_t y_stride = 0;
  int64_t n_tok = 0;
  const float* bias = nullptr;  // [n_out] or null
  float scale = 1.0f;
  bool bias_before_scale = false;
  // y = product + residual (x = x + W h in one launch, no add kernel): residual [n_tok][y_stride],
  // where matmul_adds_residual holds.
  const float* residual = nullptr;
  // Expert products (MoE). w is a stack of experts expert_bytes apart; slot s in [0, n_slots)
  // multiplies expert slot_expert[s] (device memory, so routing never leaves the device) with
  // activation row s / x_div (n_tok rows) into output row s of y (stride y_stride). bias is
  // then [n_expert][n_out], and expert_scale [n_expert] (or null) replaces scale. Always the
  // matrix-vector kernels, whatever n_tok.
  const int32_t* slot_expert = nullptr;
  int64_t n_slots = 0, x_div = 1;   // any number of slots (launched in grid-y chunks)
  size_t expert_bytes = 0;
  const float* expert_scale = nullptr;
  // slot_expert was written by a kernel that finished before this launch's predecessor began,
  // so the stream kernel may read it, and copy its experts' first weights, before its
  // dependency wait (pdl.cuh). moe_ffn sets it on the experts' down product only: its
  // predecessor (the GLU) starts after the gate/up product started, and that one started
  // after the routing had finished (a plain launch, which never releases its successor
  // early), or wrote the routing itself (route below) and finished before the GLU's blocks
  // passed their wait. Elsewhere the routing may be the predecessor itself: leave it false.
  bool slots_settled = false;
  // The routing of this launch's one token run by the launch's own blocks, in place of a
  // routing kernel (launch_route) before it, where matmul_routes_in_launch holds: slot_expert
  // is then route->expert, which block (0, 0) writes (with route->weight) for the products and
  // the combine after this launch; this launch's blocks take their slots' experts from their
  // own ranking. Read at launch.
  const RouteParams* route = nullptr;
  // The MoE combine in this launch (the experts' down of one token, where
  // matmul_combines_in_launch holds): y is ONE row [n_out] = (residual +) sum_j combine_w[j] *
  // (slot j's product), launch_moe_combine's sum in its order, in place of the slots' rows.
  // combine_w: [n_slots] device weights (RouteParams::weight). residual may alias y.
  const float* combine_w = nullptr;
  // Per-head products of a prompt batch (latent attention's wk_b and wv_b): w is a stack of
  // head_batch matrices expert_bytes apart, the n_tok rows of x and y are [token][head] (x_stride,
  // y_stride apart), and row t * head_batch + h takes matrix h: one strided-batched cuBLAS call
  // over the heads (x rounded as for any cuBLAS product, the stack dequantized to f16 in the
  // scratch after x's copy). Never with bias, scale, residual, slots or groups.
  int64_t head_batch = 0;
  // Expert rows (prompt-sized MoE batches; moe.cuh SlotSort): w is a stack of experts as for
  // slots, and the n_tok rows of x and y are in expert order, group_rows[e] of them for expert
  // e (HOST memory, n_expert entries, summing to n_tok). Each expert with rows is one product,
  // all of them one grouped cuBLAS call (cublasGemmGroupedBatchedEx) where cuBLAS takes the
  // types, else a call per expert; other types' experts dequantized to f16 in runs that fit
  // the scratch, a call (or calls) per run. group_ptrs: device room for 3 * n_expert pointers.
  // Never with bias, scale, residual or slots.
  const int32_t* group_rows = nullptr;
  int64_t n_expert = 0;
  void** group_ptrs = nullptr;
  // cuBLAS path only: handle bound to `stream`, and f16 scratch of scratch_elems elements.
  cublasHandle_t blas = nullptr;
  void* scratch = nullptr;
  size_t scratch_elems = 0;
  // When set ([n_tok][n_in] floats): x is first rounded to the activation format the HOST
  // dot product of this weight type uses (Q8_0/Q8_1 blocks for legacy quants, Q8_K for
  // K-quants and IQ4_XS, f16 for F16, bf16 for BF16; llama.cpp's CPU scheme), so device and
  // host products differ only in summation order. Null: x is used as it is.
  float* act_round = nullptr;
  // The matrix-vector kernels (f32 accumulation of exactly rounded inputs) at any n_tok: for
  // products whose ranking matters, as an MoE router's top-k (cuBLAS rounds both operands to
  // f16, which can reorder near-tied experts).
  bool matvec_only = false;
  // Stream kernel (launch_matmuls: the first product's): warps per row pair, 1, 2 or 4; 0 lets
  // the launch choose (matvec.cu, matvec_ksplit). Tests force it.
  int ksplit = 0;
  // Stream kernel for Q4_0: one lane per block pair (matvec.cu, kQ4_0Pairs; -1 or 1, the
  // default: 8B tg128 309.6 -> 316.5 on the H200) or, 0, two lanes per block (tests compare).
  int q4_0_pairs = -1;
  // Decode q/k/v products with RoPE (set on each of the three, only where matmul_can_rope says
  // so): this product writes r's q (y == r.x), k (y == r.x2) or v (y == r.v), and its store
  // applies r as launch_rope(r) after the products would, the same bits: q and k row pairs
  // rotated, k and v rows appended to the mirror and staging rows. The caller then skips
  // launch_rope. Why: that launch was 3.9 us of an 8B decode layer (ncu, H200), ~4% of a token.
  const RopeLaunch* rope = nullptr;
  // launch_matmuls only, first product: x is first computed as this norm's output (pre_norm->y
  // == x, its rows and width x's), in the same launch as x's preparation for the dp4a kernels
  // when that is what the products need (one kernel fewer per norm and product group).
  const NormParams* pre_norm = nullptr;
  // The same for a gated activation: x is pre_glu's output (out == x, [n_tok][n_in]), computed
  // in the kernel that quantizes it when the products' preparation is a dp4a one. F16 / BF16
  // products on cuBLAS read its 16-bit copy alone, and x is then left unwritten.
  const GluParams* pre_glu = nullptr;
  // launch_matmuls only, first product: act_round ALREADY holds x as the dp4a kernels read it
  // (Q8_0 blocks, q8_0_act, or Q8_K blocks, q8k_act; or rounded to f16 / bf16), written by
  // x's producer (the attention merge: AttnParams::out_q8 / out_round; a norm run alone:
  // launch_matmul_producer), so the group starts without preparing x. x must hold the f32
  // values too: later products of another preparation read them. Only where
  // matmul_reads_q8_blocks or matmul_reads_rounded16 (first product); otherwise, or
  // with pre_norm / pre_glu, the launch fails (cudaErrorInvalidValue): the caller asked that
  // predicate, so a mismatch is a bug.
  bool x_prepared = false;
  // NormFold (above). fold_out: this product (matmul_folds_norm) writes the fold of its y for
  // the next products. fold_in: launch_matmuls only, first product, with x_prepared and
  // act_round == fold_in->q: the group reads that fold (each product matmul_takes_folded_norm).
  const NormFold* fold_out = nullptr;
  const NormFold* fold_in = nullptr;
  cudaStream_t stream = nullptr;
};

// x in the dp4a kernels' Q8_0 layout, in p.act_round: int8 quants [n_tok][n_in], then f32
// block scales [n_tok][n_in / 32].
struct Q8_0Act {
  int8_t* q;
  float* d;
};
inline Q8_0Act q8_0_act(const MatmulParams& p) {
  int8_t* q = reinterpret_cast<int8_t*>(p.act_round);
  return {q, reinterpret_cast<float*>(q + p.n_tok * p.n_in)};
}
// x in the dp4a kernels' Q8_K layout, in p.act_round (bytes): int8 q [n_tok][n_in], then f32
// d [n_tok][n_in / 256], then int32 sum [n_tok][n_in / 32]: at most 1.14 bytes per element of
// the 4 available.
struct Q8KAct {
  int8_t* q;
  float* d;
  int32_t* sum;
  // The same layout from activation row r on.
  __host__ __device__ Q8KAct at_row(int64_t r, int64_t n_in) const {
    return {q + r * n_in, d + r * (n_in / 256), sum + r * (n_in / 32)};
  }
};
inline Q8KAct q8k_act(const MatmulParams& p) {
  int8_t* q = reinterpret_cast<int8_t*>(p.act_round);
  float* d = reinterpret_cast<float*>(q + p.n_tok * p.n_in);
  int32_t* sum = reinterpret_cast<int32_t*>(d + p.n_tok * (p.n_in / 256));
  return {q, d, sum};
}

// Whether type id `type` has a device kernel (the same list the dispatch uses).
bool matmul_supported(int type);
// Q4_0 and Q8_0 matrices live on the device in groups of 8 blocks as kQ4_0X8 / kQ8_0X8
// (dequant.cuh): each group holds its 8 blocks' quants (in 16-byte words, word h of every
// block in a run of its own), then their 8 f16 scales; Q4_K, Q5_K and
// Q6_K ones of whole tiles of 8 super-blocks (n_in % 2048 == 0) as kQ4_KX8 / kQ5_KX8 / kQ6_KX8:
// the tile's parts regrouped in the runs the kernel's lanes read (Q4_K: the 8 headers, then the
// quants interleaved in 16-byte words; Q5_K: its fifth bits between them, a lane's 64 in a run).
// The file's bytes, reordered inside each group. Why: a lane then reads its block's quants as
// aligned 16-byte loads next to its neighbours' (coalesced), so the decode kernel (matvec.cu,
// matvec_reg_kernel) reads rows straight into registers, where the 18- and 34-byte blocks (2-byte
// aligned) and Q4_K's 144-byte super-blocks (a lane's loads 144 bytes from the next lane's) had
// to be staged through shared memory first. MXFP4 matrices of any width as kMXFP4X16 (groups of
// 16 blocks: the scales, then the codes in 16-byte words; their rows padded to 16 bytes).
// x8_type: the type id a matrix of `type` and width n_in is kept as on the device, in rows of
// device_row_bytes (the file's row_bytes padded: Q4_0 / Q8_0 to whole 8-block groups, other
// block types to 16 bytes; F32 / F16 / BF16 as they are).
int x8_type(int type, int64_t n_in);
size_t device_row_bytes(int type, int64_t n_in, size_t row_bytes);
// Reorders n_bytes of rows of `type` (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K or MXFP4) and width n_in at w
// (device memory, 16-byte aligned; rows of whole groups or tiles, MXFP4's padded to 16 bytes) in
// place to x8_type's layout, on `stream`.
void repack_x8(int type, void* w, size_t n_bytes, int64_t n_in, cudaStream_t stream);
// f16 scratch elements the cuBLAS path needs for an x batch of n_tok x n_in (weight tiles
// are sized to what is left, at least one row per tile).
size_t matmul_scratch_elems(int64_t n_in, int64_t n_tok);
void launch_matmul(const MatmulParams& p);
// Whether group_rows products still take cuBLAS's grouped call (false once cuBLAS answered
// NOT_SUPPORTED: then one call per expert).
bool gemm_grouped_calls();
// Whether product p (as the first of a launch_matmuls group) reads x from act_round as
// blocks of a dp4a layout: Q8_0 (q8_0_act; Q4_0/Q8_0 weights on the matrix-vector path,
// n_in % 32 == 0) or Q8_K (q8k_act; Q4_K/Q6_K there, n_in % 256 == 0), act_round set. The
// test a producer asks before writing them there for x_prepared.
bool matmul_reads_q8_blocks(const MatmulParams& p);
// The Q8_0 case of it alone, for a producer that can write only Q8_0 blocks (the attention
// merge: AttnParams::out_q8).
bool matmul_reads_q8_0(const MatmulParams& p);
// Whether p, residual set, adds it in its own epilogue: matrix-vector batches (residual may be
// y itself or another buffer); cuBLAS batches in place (residual == y, added through beta = 1),
// with no bias or scale after the product. Never expert products, but combine_w's one row.
bool matmul_adds_residual(const MatmulParams& p);
// Experts a launch that routes itself ranks at most (4 a lane). A 512-expert routing (top-10
// over 16 keys a lane) in every block of qwen3-next-80b-a3b's Q4_K gate/up lost to the routing
// kernel: 8 layers Q4_K_M, graph 0.543 / 0.543 -> 0.578 / 0.578 ms (H200, one call); its
// top-k took the kernel past 64 registers (16 bytes spilled).
inline constexpr int64_t kRouteInLaunchMaxExperts = 128;
// Whether expert product p (and the products launched beside it, of p's type and width) can
// take MatmulParams::route with routing r: one token's Q4_0 rows of at most 2048 elements as
// the device keeps them (matvec_narrow_kernel) with act_round set, at most
// kRouteInLaunchMaxExperts experts. On the row-pair kernel (Q8_0, Q4_K, Q6_K experts) the
// routing in the launch lost: qwen3-30b-a3b 16 layers, graph ms, Q8_0 0.877 / 0.880 -> 0.902 /
// 0.898, Q4_K_M 0.860 / 0.860 -> 0.901 / 0.900 (H200, one call, alternating).
bool matmul_routes_in_launch(const MatmulParams& p, const RouteParams& r);
// Whether expert product p can take MatmulParams::combine_w: one token's slots (x_div 1, a row
// of x each) of rows the narrow kernels take (Q4_0 rows up to 2048 wide as the device keeps
// them; Q4_K / Q5_K rows up to 1024, Q6_K up to 512: qwen3-next's downs), at most 16 slots,
// with act_round set, slots_settled, no bias, expert scale, scale, RoPE or routing in the
// launch.
bool matmul_combines_in_launch(const MatmulParams& p);
// Whether product p reads x from act_round rounded to f16 / bf16 and kept as f32 ([n_tok][n_in];
// F16 / BF16 weights on the matrix-vector path, act_round set): what a producer writes there
// for x_prepared (the norm and GLU producers, the attention merge: AttnParams::out_round).
bool matmul_reads_rounded16(const MatmulParams& p);
// Bytes of act_round that x prepared for matmul_reads_q8_blocks products of n_tok rows of
// n_in takes: the larger of the two layouts (a producer's buffer serving either).
size_t matmul_q8_blocks_bytes(int64_t n_in, int64_t n_tok);
// p.pre_norm or p.pre_glu alone, as launch_matmuls runs it first: fused with x's
// preparation for p when p's is a dp4a one the fused kernels cover, or the rounding of an F16 /
// BF16 decode product (launch_norm_round, launch_glu_round), or x's 16-bit copy for a product
// on cuBLAS (in the scratch: launch_norm_16bit, launch_glu_16bit for F16 / BF16;
// launch_norm_blocks_16bit, launch_glu_blocks_16bit, x's Q8 / Q8_K rounding, for the
// quantized types). True when
// act_round (or that scratch) then holds x prepared for p (the products launched later with the producer cleared and
// x_prepared set, when matmul_reads_q8_blocks(p)); false: only x was written.
// With `router` (norm_router_ok: a one-row RMS norm): that router's logits of the norm's
// output too, in the same launch.
struct RouterNormParams;  // moe.cuh
bool norm_router_ok(const MatmulParams& p, const RouterNormParams& router);
bool launch_matmul_producer(const MatmulParams& p, const RouterNormParams* router = nullptr);
// Several products of ONE input (the same x, x_stride, n_in, n_tok, act_round, scratch and
// stream; q/k/v or gate/up): x is rounded (or quantized, or converted to f16) once for each
// run of products that need the same form, not once per product.
void launch_matmuls(const MatmulParams* ps, int n);
// Whether launch_matmuls(ps, n) can apply r in the stores of the products r names
// (MatmulParams::rope): the K/V append (mirror_k and v set), even head_dim and n_rot <=
// head_dim, and ps holding r's q, k and v products (y at r's x, x2, v; widths and strides r's,
// the mirror's rows as wide as k's and v's) each on the decode stream kernel (n_tok <=
// kMatvecMaxTok, no experts, staged rows of its types); and either adjacent-pair RoPE without
// QK-norm, or neox RoPE (with or without the QK-norm launch_rope would fuse: rope_norm_fuses)
// where every product holds matmul_ropes_neox and q and k start on a head's pairs. False
// (prefill, cuBLAS, unstaged rows, other kernel families, wider rows): the products without
// it, then launch_rope(r), as before.
bool matmul_can_rope(const MatmulParams* ps, int n, const RopeLaunch& r);
// Whether q/k/v product p can take neox RoPE r (and its QK-norm) in its store: one token, full
// rotation, on the narrow rope kernel (Q4_0 rows of at most 4096 elements as the device keeps
// them) or the row-pair register kernel (the x8 layouts, F16 / BF16 rows), with a head's
// rotation pairs whole blocks of at most 8 (a thread-block cluster), on a device of sm_90 or newer.
bool matmul_ropes_neox(const MatmulParams& p, const RopeLaunch& r);
// Whether one-token product p writes a NormFold of its output (MatmulParams::fold_out): Q8_0 /
// Q4_0 matrices as the device keeps them on the one-row register kernel (Q4_0 wider than the
// narrow kernel's rows), a launch of its own with the residual added and no bias, scale,
// experts or RoPE, n_out a multiple of 32.
bool matmul_folds_norm(const MatmulParams& p);
// Whether a one-token product of device type `type` and width n_in reads a NormFold
// (MatmulParams::fold_in): its launch takes matvec_reg_kernel, as for Q8_0 always, and for Q4_0
// rows wider than the narrow kernel's without neox RoPE in the store (the narrow rope kernel).
bool matmul_takes_folded_norm(int type, int64_t n_in, bool neox_rope);
// Makes the n products of one launch_matmuls group read fold f (each must
// matmul_takes_folded_norm) in place of a normed x: no norm, f's quants as their prepared x.
inline void read_norm_fold(MatmulParams* ps, int n, const NormFold& f) {
  for (int i = 0; i < n; ++i) ps[i].act_round = reinterpret_cast<float*>(f.q);
  ps[0].pre_norm = nullptr;
  ps[0].x_prepared = true;
  ps[0].fold_in = &f;
}

}  // namespace frink::cuda
