// Activation preparation for the matrix products: x rounded to the format the host's dot
// product of each weight type reads (so device and host products differ only in summation
// order), or quantized to int8 blocks for the dp4a decode kernels.
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/matmul_parts.cuh"
#include "cuda/moe.cuh"
#include "cuda/norm_row.cuh"
#include "cuda/glu_value.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_0_rule.cuh"
#include "cuda/q8k_rule.cuh"
#include "cuda/round16_rule.cuh"

namespace frink::cuda::mm {

namespace {

// The host's two rounding rules are written once for the kernels below (the rounded-f32,
// int8 and fused forms must agree value for value), and for attention's merge, which writes
// either for the wo product: q8_0_rule.cuh and q8k_rule.cuh.

// Q8_K's scale source over a 256-block held by a warp as v[k] = element lane + 32 k: the
// signed value of the FIRST element of largest magnitude (the host's strict '>' scan), and
// that magnitude in amax (0 for an all-zero block). Lanes scan their own elements in index
// order; the reduction keeps the larger magnitude, on a tie the lower index.
__device__ __forceinline__ float q8k_signed_max(const float (&v)[8], float& amax) {
  const int lane = threadIdx.x % 32;
  float mx = 0.0f;
  int idx = INT32_MAX;
  amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (fabsf(v[k]) > amax) {
      amax = fabsf(v[k]);
      mx = v[k];
      idx = lane + 32 * k;
    }
  warp_first_max(amax, mx, idx);
  return mx;
}

// dp4a path (Q4_0, Q8_0; used when act_round is given): x is quantized once per matmul to
// int8 Q8_0 blocks with the host's rule (d = amax/127, q = roundf(x/d), d kept as f16), then
// one warp per row dots 4-byte chunks of weight quants with the int8 activation (__dp4a) and
// scales each 32-block by d_w * d_x (the host's vec_dot_q4_0_q8_0 / q8_0_q8_0 arithmetic).
// One warp per Q8 block: lane j quantizes element j. xq: [n_tok][n_in] int8, xd: [n_tok][n_in/32].
// The source is x itself (RowSource) or the gated activation computed on the way (GluSource,
// which also stores it: the down product's x, fused with its quantization).
// A source reads with operator() and stores what it computed with keep(): separate, so a
// kernel reading several elements issues every load before any store (g.out may alias
// gate/up for all the compiler knows: a store between them serialised the Q8_K kernel's 8
// reads per lane into 8 memory round trips, 7.9 us for one 8B GLU, against 2.8 us for Q8_0).
struct RowSource {
  const float* x;
  int64_t x_stride;
  __device__ float operator()(int64_t t, int64_t e) const { return x[t * x_stride + e]; }
  __device__ void keep(int64_t, int64_t, float) const {}
};
struct GluSource {
  GluParams g;
  __device__ float operator()(int64_t t, int64_t e) const { return glu_value(g, t, e); }
  __device__ void keep(int64_t t, int64_t e, float v) const { g.out[t * g.n + e] = v; }
};
// The GLU with its up norm: every thread of a block calls it, 256 elements of one token a block
// (glu_norm_ok; both kernels below lay blocks out so when n_in is a multiple of 256).
struct GluNormSource {
  GluParams g;
  __device__ float operator()(int64_t t, int64_t e) const { return glu_norm_value(g, t, e); }
  __device__ void keep(int64_t t, int64_t e, float v) const { g.out[t * g.n + e] = v; }
};

// src without its store (keep): the GLU before a cuBLAS down product, which reads the 16-bit
// copy alone, need not write its f32 values too (a third of the launch's bytes for the 8B).
template <typename Src>
struct Unkept {
  Src src;
  __device__ float operator()(int64_t t, int64_t e) const { return src(t, e); }
  __device__ void keep(int64_t, int64_t, float) const {}
};

// Q8 blocks (32) and Q8_K blocks (256): one warp per block, lane j holding elements
// j + 32 k, so loads and stores are coalesced (v1 gave each thread a whole block and read it
// serially: 65 us per 4096 x 512 activation on the H200, 14% of a pp512 batch). The
// arithmetic is the host's, element for element; only the reductions are parallel, and
// max is exact in any order. Q8_K takes the signed value of the FIRST element of largest
// magnitude (the host's strict '>'), so ties break to the lowest index here too.
// O: float (the rounded values), or __half: their f16 copy, which the quantized types' cuBLAS
// path reads (gemm.cu's x_16bit, the same conversion), where a second launch converted the f32
// copy (1.5 ms of an 8B Q4_0 pp512 batch's 30 ms of kernels, H200 ncu).
template <int BS, typename Src, typename O>
__global__ void act_round_block_kernel(Src src, int64_t n_in, int64_t n_tok, O* out) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  constexpr int kPer = BS / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n_blk = n_in / BS;
  const int64_t g = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (g >= n_blk * n_tok) return;
  const int64_t t = g / n_blk, b = g % n_blk;
  O* o = out + t * n_in + b * BS;
  const auto put = [](float v) {
    if constexpr (std::is_same_v<O, __half>) return __float2half_rn(v);
    else return v;
  };
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = src(t, b * BS + lane + 32 * k);
  if constexpr (BS == 32) {
    float amax = fabsf(v[0]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const Q8Rule r = q8_0_rule(amax);
    o[lane] = put(roundf(v[0] * r.inv) * r.d);
  } else {
    float amax;
    const float mx = q8k_signed_max(v, amax);
    const float iscale = q8k_iscale(amax, mx), d = q8k_scale(amax, iscale);
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[lane + 32 * k] = put(q8k_quant_f(v[k], amax, iscale) * d);
  }
}

// f16/bf16 rounding (round16_rule.cuh, stored as O) of src's [n_tok][n_in] values: one thread
// per element, 256 a block, over row_grid (GluNormSource: a block holds 256 elements of one
// token).
template <typename Src, typename O>
__global__ void act_round_elem_kernel(Src src, int64_t n_in, int64_t n_tok, bool bf16, O* out) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  for (int64_t t = blockIdx.y; t < n_tok; t += gridDim.y)
    for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n_in; e += int64_t{gridDim.x} * blockDim.x) {
      const float v = src(t, e);
      src.keep(t, e, v);
      out[t * n_in + e] = store16<O>(v, bf16);
    }
}

template <typename Src>
__global__ void quantize_q8_kernel(Src src, int64_t n_in, int64_t n_tok, int8_t* xq, float* xd) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  const int lane = threadIdx.x % 32;
  const int64_t n_blk = n_in / 32;
  const int64_t g = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (g >= n_blk * n_tok) return;
  const int64_t t = g / n_blk, b = g % n_blk;
  const float v = src(t, b * 32 + lane);
  src.keep(t, b * 32 + lane, v);
  const Q8Elem e = q8_0_warp_block(v);
  xq[t * n_in + b * 32 + lane] = e.q;
  if (lane == 0) xd[t * n_blk + b] = e.d;
}

// One block of 256 threads per 256-block, one element per thread: warp w holds sub-block (32)
// w, so its sum is one warp reduction, and the scale source meets across the 8 warps in
// shared memory. Why: one warp per 256-block (lane j holding elements j + 32 k) gave an 8B
// GLU 7 blocks on 7 SMs and every lane eight sum reductions; left out of the 8B Q4_K_M token
// graph it saved 3.8 us a layer (2.677 -> 2.554 ms, H200), where the Q8_0 GLU (a warp per
// 32-block, 56 blocks) costs 0.7 us. This way: 2.677 / 2.674 -> 2.587 / 2.593 ms (one call,
// alternating).
template <typename Src>
__global__ void __launch_bounds__(256) quantize_q8k_kernel(Src src, int64_t n_in, Q8KAct a) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  __shared__ Q8KShared sh;
  const int64_t n_blk = n_in / 256, b = blockIdx.x, t = blockIdx.y, e = b * 256 + threadIdx.x;
  const float v = src(t, e);
  src.keep(t, e, v);
  const Q8KElem q = q8k_block_256(v, sh);
  a.q[t * n_in + e] = static_cast<int8_t>(q.q);
  if (threadIdx.x % 32 == 0) a.sum[t * (n_in / 32) + b * 8 + threadIdx.x / 32] = q.sum;
  if (threadIdx.x == 0) a.d[t * n_blk + b] = q.d;
}


// Four consecutive values stored as O (store16) in one store: 16 bytes of f32, 8 of 16 bits.
template <typename O>
struct alignas(4 * sizeof(O)) Four {
  O v[4];
};

// Where a norm's Q8 / Q8_K rounding goes (norm_q8_row, norm_q8k_row), four values a thread:
// put(p, row, i, q, qsum, d) for elements [4 i, 4 i + 4) of the row, their quants q, the sum of
// the 8 threads' quants around (Q8_K's sub-block sum) and the block's scale d.
struct Q8_0Out {  // Q8_0 blocks: int8 [rows][n], scales [rows][n / 32]
  int8_t* q;
  float* d;
  __device__ void put(const NormParams& p, int64_t row, int64_t i, const int (&qi)[4], int, float dd) const {
    reinterpret_cast<char4*>(q + row * p.n)[i] = make_char4(qi[0], qi[1], qi[2], qi[3]);
    if (threadIdx.x % 8 == 0) d[row * (p.n / 32) + i / 8] = dd;
  }
};
struct Q8KOut {  // Q8_K blocks (Q8KAct)
  Q8KAct a;
  __device__ void put(const NormParams& p, int64_t row, int64_t i, const int (&qi)[4], int qsum, float dd) const {
    reinterpret_cast<char4*>(a.q + row * p.n)[i] = make_char4(qi[0], qi[1], qi[2], qi[3]);
    if (threadIdx.x % 8 == 0) a.sum[row * (p.n / 32) + i / 8] = qsum;
    if (threadIdx.x % 64 == 0) a.d[row * (p.n / 256) + i / 64] = dd;
  }
};
// The rounded values q d as f16 [rows][n]: the copy a quantized product on cuBLAS reads
// (act_round_block_kernel's values, as launch_act_round writes them with x16).
struct F16Out {
  __half* x;
  __device__ void put(const NormParams& p, int64_t row, int64_t i, const int (&qi)[4], int, float dd) const {
    reinterpret_cast<Four<__half>*>(x + row * p.n)[i] =
        Four<__half>{{__float2half_rn(qi[0] * dd), __float2half_rn(qi[1] * dd), __float2half_rn(qi[2] * dd),
                      __float2half_rn(qi[3] * dd)}};
  }
};

// The norm's row (norm_vec_row: thread i holds elements 4 (i + k blockDim) ..) quantized in
// registers. Q8_0: a 32-block is 8 consecutive threads of one warp; the arithmetic is
// quantize_q8_kernel's, value for value.
template <typename Out>
__device__ __forceinline__ void norm_q8_row(const NormParams& p, const Out& out, int64_t row) {
  float4 o[kNormVecPer];
  norm_vec_row(p, o, row);
  const int64_t n4 = p.n / 4;
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    if (int64_t{k} * blockDim.x >= n4) break;  // the rest of the slabs lie past the row (block-uniform)
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    float amax = fmaxf(fmaxf(fabsf(o[k].x), fabsf(o[k].y)), fmaxf(fabsf(o[k].z), fabsf(o[k].w)));
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (i >= n4) continue;  // a whole 32-block is in the row or past it (n % 32 == 0)
    const Q8Rule r = q8_0_rule(amax);
    const int q[4] = {static_cast<int>(roundf(o[k].x * r.inv)), static_cast<int>(roundf(o[k].y * r.inv)),
                      static_cast<int>(roundf(o[k].z * r.inv)), static_cast<int>(roundf(o[k].w * r.inv))};
    out.put(p, row, i, q, 0, r.d);
  }
}

// Q8_K: a 256-block is 64 consecutive threads, two warps (threads a multiple of 64). The scale
// source is quantize_q8k_kernel's: the signed value of the first element of largest magnitude
// (each thread scans its four in order with a strict '>', reductions keep the larger
// magnitude and on a tie the lower index); sums per 32 over 8 threads.
template <typename Out>
__device__ __forceinline__ void norm_q8k_row(const NormParams& p, const Out& out, int64_t row) {
  __shared__ float s_amax[32], s_mx[32];
  __shared__ int s_idx[32];
  float4 o[kNormVecPer];
  norm_vec_row(p, o, row);
  const int64_t n4 = p.n / 4;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    // Slabs past the row: none of their blocks is live, and each cost two block barriers and
    // three warp reductions (a 4096 row takes 1024 threads, one slab of four: norm_q8k was
    // 6.8 us against norm_q8's 3.6 on the H200). Block-uniform, so the barriers stay matched.
    if (int64_t{k} * blockDim.x >= n4) break;
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    const float v[4] = {o[k].x, o[k].y, o[k].z, o[k].w};
    float amax = 0.0f, mx = 0.0f;
    int idx = INT32_MAX;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (fabsf(v[j]) > amax) {
        amax = fabsf(v[j]);
        mx = v[j];
        idx = static_cast<int>(4 * i + j);
      }
    warp_first_max(amax, mx, idx);
    __syncthreads();  // the previous slab's values are read
    if (lane == 0) {
      s_amax[warp] = amax;
      s_mx[warp] = mx;
      s_idx[warp] = idx;
    }
    __syncthreads();
    take_first_max(s_amax[warp ^ 1], s_mx[warp ^ 1], s_idx[warp ^ 1], amax, mx, idx);  // the block's other warp
    const bool live = i < n4;  // a whole 256-block is in the row or past it (n % 256 == 0)
    const float iscale = q8k_iscale(amax, mx);
    int qi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) qi[j] = q8k_quant(v[j], amax, iscale);
    int qs = qi[0] + qi[1] + qi[2] + qi[3];
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) qs += __shfl_xor_sync(0xffffffffu, qs, off);
    if (!live) continue;
    out.put(p, row, i, qi, qs, q8k_scale(amax, iscale));
  }
}

// The norm's row and its output rounded as act_round_elem_kernel would, into out [n_rows][n].
template <typename O>
__device__ __forceinline__ void norm_round_row(const NormParams& p, bool bf16, O* out, int64_t row) {
  float4 o[kNormVecPer];
  const int64_t n4 = p.n / 4;
  norm_vec_row(p, o, row);
  Four<O>* y = reinterpret_cast<Four<O>*>(out + row * p.n);
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    if (i < n4)
      y[i] = Four<O>{{store16<O>(o[k].x, bf16), store16<O>(o[k].y, bf16), store16<O>(o[k].z, bf16),
                      store16<O>(o[k].w, bf16)}};
  }
}

template <typename O>
__global__ void __launch_bounds__(kNormMaxThreads) norm_round_kernel(NormParams p, bool bf16, O* out) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  norm_round_row(p, bf16, out, blockIdx.x);
}

template <typename Out>
__global__ void __launch_bounds__(kNormMaxThreads) norm_q8_kernel(NormParams p, Out out) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  norm_q8_row(p, out, blockIdx.x);
}

template <typename Out>
__global__ void __launch_bounds__(kNormMaxThreads) norm_q8k_kernel(NormParams p, Out out) {
  dependent_kernel_start();  // the product after it may start its weight copies (pdl.cuh)
  norm_q8k_row(p, out, blockIdx.x);
}

// Two jobs in one launch (launch_norm_router): block 0 the producer (Kind 0: the norm alone,
// 1: with Q8_0 blocks, 2: with Q8_K blocks, 3: rounded to f16, 4: to bf16, in xr), blocks 1..
// one router row each, which norm x themselves (norm_vec_row without the store: the
// producer's h, bit for bit) and dot their row with it. The router's weights load before the dependency wait.
template <int Kind>
__global__ void __launch_bounds__(kNormMaxThreads)
    norm_router_kernel(NormParams p, int8_t* xq, float* xd, Q8KAct a, float* xr, RouterNormParams r) {
  if (blockIdx.x == 0) {
    grid_dependency_wait();
    if constexpr (Kind == 1) {
      norm_q8_row(p, Q8_0Out{xq, xd}, 0);
    } else if constexpr (Kind == 2) {
      norm_q8k_row(p, Q8KOut{a}, 0);
    } else if constexpr (Kind == 3 || Kind == 4) {
      norm_round_row(p, Kind == 4, xr, 0);
    } else {
      float4 o[kNormVecPer];
      norm_vec_row(p, o, 0);
    }
    return;
  }
  const int64_t n4 = p.n / 4;
  const float4* w = reinterpret_cast<const float4*>(r.w + (blockIdx.x - 1) * p.n);
  float4 wv[kNormVecPer];
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    wv[k] = i < n4 ? w[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  grid_dependency_wait();
  float4 o[kNormVecPer];
  norm_vec_row<false>(p, o, 0);
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVecPer; ++k) acc += (wv[k].x * o[k].x + wv[k].y * o[k].y) + (wv[k].z * o[k].z + wv[k].w * o[k].w);
  __shared__ float red[32];
  acc = block_sum(acc, red);
  // A bias as the product's epilogue adds it (scale 1: cuda_backend_moe.cpp's router_f32).
  if (threadIdx.x == 0) r.logits[blockIdx.x - 1] = r.b ? acc + r.b[blockIdx.x - 1] : acc;
}

}  // namespace

template <typename Src, typename O>
void launch_round16(Src src, int64_t n_in, int64_t n_tok, bool bf16, O* out, cudaStream_t stream) {
  launch_dependent(act_round_elem_kernel<Src, O>, row_grid(n_in, n_tok), 256, 0, stream, src, n_in, n_tok, bf16, out);
  FRINK_CUDA_CHECK_LAUNCH();
}

// out as the 16-bit type bf16 names.
template <typename F>
void as16(bool bf16, void* out, F&& f) {
  if (bf16) f(static_cast<__nv_bfloat16*>(out));
  else f(static_cast<__half*>(out));
}

// src's Q8 (kind kActQ8Blocks) or Q8_K rounding into out (f32 or f16).
template <typename Src, typename O>
void launch_round_blocks(Src src, int64_t n_in, int64_t n_tok, ActRound kind, O* out, cudaStream_t stream) {
  const int64_t n_warps = n_tok * (n_in / act_block_elems(kind));
  const unsigned grid = static_cast<unsigned>((n_warps + 7) / 8);
  if (kind == kActQ8Blocks)
    launch_dependent(act_round_block_kernel<32, Src, O>, grid, 256, 0, stream, src, n_in, n_tok, out);
  else
    launch_dependent(act_round_block_kernel<256, Src, O>, grid, 256, 0, stream, src, n_in, n_tok, out);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_act_round(const MatmulParams& p, ActRound kind, __half* x16) {
  if (kind == kActF16 || kind == kActBF16) {
    FRINK_CUDA_CHECK(x16 ? cudaErrorInvalidValue : cudaSuccess);  // F16 / BF16: launch_x_16bit
    launch_round16(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, kind == kActBF16, p.act_round, p.stream);
    return;
  }
  if (x16) launch_round_blocks(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, kind, x16, p.stream);
  else launch_round_blocks(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, kind, p.act_round, p.stream);
}

template <typename Src>
void launch_q8(Src src, int64_t n_in, int64_t n_tok, int8_t* xq, float* xd, cudaStream_t stream) {
  const int64_t n_warps = n_tok * (n_in / 32);
  launch_dependent(quantize_q8_kernel<Src>, static_cast<unsigned>((n_warps + 7) / 8), 256, 0, stream, src, n_in, n_tok,
                   xq, xd);
  FRINK_CUDA_CHECK_LAUNCH();
}

template <typename Src>
void launch_q8k(Src src, int64_t n_in, int64_t n_tok, const Q8KAct& x, cudaStream_t stream) {
  FRINK_CUDA_CHECK(n_tok <= 65535 ? cudaSuccess : cudaErrorInvalidValue);  // grid y
  launch_dependent(quantize_q8k_kernel<Src>, dim3(static_cast<unsigned>(n_in / 256), static_cast<unsigned>(n_tok)), 256,
                   0, stream, src, n_in, x);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_quantize_q8(const MatmulParams& p, int8_t* xq, float* xd) {
  launch_q8(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, xq, xd, p.stream);
}

void launch_quantize_q8k(const MatmulParams& p, const Q8KAct& x) {
  launch_q8k(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, x, p.stream);
}

// launch(source) with g's source: the GLU, or the GLU with its up norm.
template <typename Launch>
void with_glu_source(const GluParams& g, Launch&& launch) {
  FRINK_CUDA_CHECK(!g.up_norm_w || glu_norm_ok(g) ? cudaSuccess : cudaErrorInvalidValue);
  if (g.up_norm_w) launch(GluNormSource{g});
  else launch(GluSource{g});
}

void launch_glu_q8(const GluParams& g, int8_t* xq, float* xd) {
  with_glu_source(g, [&](auto src) { launch_q8(src, g.n, g.n_tok, xq, xd, g.stream); });
}

void launch_glu_q8k(const GluParams& g, const Q8KAct& x) {
  with_glu_source(g, [&](auto src) { launch_q8k(src, g.n, g.n_tok, x, g.stream); });
}

void launch_glu_round(const GluParams& g, bool bf16, float* out) {
  with_glu_source(g, [&](auto src) { launch_round16(src, g.n, g.n_tok, bf16, out, g.stream); });
}

void launch_glu_blocks_16bit(const GluParams& g, ActRound kind, __half* out) {
  FRINK_CUDA_CHECK(!g.up_norm_w && (kind == kActQ8Blocks || kind == kActQ8K) ? cudaSuccess : cudaErrorInvalidValue);
  launch_round_blocks(Unkept<GluSource>{GluSource{g}}, g.n, g.n_tok, kind, out, g.stream);
}

void launch_glu_16bit(const GluParams& g, bool bf16, void* out) {
  as16(bf16, out, [&](auto* o) {
    with_glu_source(g, [&](auto src) { launch_round16(Unkept<decltype(src)>{src}, g.n, g.n_tok, bf16, o, g.stream); });
  });
}

template <typename O>
void launch_norm_round_as(const NormParams& np, bool bf16, O* out) {
  launch_dependent(norm_round_kernel<O>, static_cast<unsigned>(np.n_rows), static_cast<unsigned>(norm_vec_threads(np.n)),
                   0, np.stream, np, bf16, out);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_norm_round(const NormParams& np, bool bf16, float* out) { launch_norm_round_as(np, bf16, out); }

void launch_x_16bit(const MatmulParams& p, bool bf16, void* out) {
  as16(bf16, out, [&](auto* o) { launch_round16(RowSource{p.x, p.x_stride}, p.n_in, p.n_tok, bf16, o, p.stream); });
}

void launch_norm_16bit(const NormParams& np, bool bf16, void* out) {
  as16(bf16, out, [&](auto* o) { launch_norm_round_as(np, bf16, o); });
}

// The norm np with its Q8 (kK false) or Q8_K rounding going to out: a block a row.
template <bool kK, typename Out>
void launch_norm_blocks(const NormParams& np, const Out& out) {
  const auto grid = static_cast<unsigned>(np.n_rows), threads = static_cast<unsigned>(norm_vec_threads(np.n));
  if constexpr (kK) launch_dependent(norm_q8k_kernel<Out>, grid, threads, 0, np.stream, np, out);
  else launch_dependent(norm_q8_kernel<Out>, grid, threads, 0, np.stream, np, out);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_norm_q8(const NormParams& np, int8_t* xq, float* xd) { launch_norm_blocks<false>(np, Q8_0Out{xq, xd}); }

void launch_norm_router(const NormParams& np, int kind, const MatmulParams& p, const RouterNormParams& r) {
  const auto grid = static_cast<unsigned>(r.n_expert + 1);
  const auto threads = static_cast<unsigned>(norm_vec_threads(np.n));
  Q8_0Act q{};
  Q8KAct k{};
  if (kind == 1) q = q8_0_act(p);
  if (kind == 2) k = q8k_act(p);
  float* xr = kind >= 3 ? p.act_round : nullptr;
  if (kind == 1) launch_dependent(norm_router_kernel<1>, grid, threads, 0, np.stream, np, q.q, q.d, k, xr, r);
  else if (kind == 2) launch_dependent(norm_router_kernel<2>, grid, threads, 0, np.stream, np, q.q, q.d, k, xr, r);
  else if (kind == 3) launch_dependent(norm_router_kernel<3>, grid, threads, 0, np.stream, np, q.q, q.d, k, xr, r);
  else if (kind == 4) launch_dependent(norm_router_kernel<4>, grid, threads, 0, np.stream, np, q.q, q.d, k, xr, r);
  else launch_dependent(norm_router_kernel<0>, grid, threads, 0, np.stream, np, q.q, q.d, k, xr, r);
  FRINK_CUDA_CHECK_LAUNCH();
}

void launch_norm_q8k(const NormParams& np, const Q8KAct& x) { launch_norm_blocks<true>(np, Q8KOut{x}); }

void launch_norm_blocks_16bit(const NormParams& np, ActRound kind, __half* out) {
  FRINK_CUDA_CHECK(kind == kActQ8Blocks || kind == kActQ8K ? cudaSuccess : cudaErrorInvalidValue);
  if (kind == kActQ8Blocks) launch_norm_blocks<false>(np, F16Out{out});
  else launch_norm_blocks<true>(np, F16Out{out});
}

}  // namespace frink::cuda::mm
