// Matrix products for the device path (see matmul.cuh).
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
#include "cuda/matmul.cuh"

#include <algorithm>
#include <type_traits>

#include <cuda_pipeline.h>

#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"

namespace frink::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

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

Args args_of(const MatmulParams& p) {
  return {static_cast<const uint8_t*>(p.w), p.row_bytes, p.n_in, p.n_out, p.x_stride, p.y_stride,
          p.x, p.y, p.bias, p.scale, p.bias_before_scale, p.residual,
          p.slot_expert, p.expert_bytes, p.x_div, p.expert_scale, 0};
}

// Expert mode (a.slot_expert set): the block's grid row blockIdx.y is slot s. Points a at
// expert slot_expert[s]'s matrix, bias row and scale and at output row s, and returns the
// activation row the slot reads (s / x_div). Otherwise returns 0 and changes nothing.
__device__ __forceinline__ int64_t select_slot(Args& a) {
  if (!a.slot_expert) return 0;
  const int64_t s = a.slot0 + blockIdx.y, e = a.slot_expert[s];
  a.w += e * a.expert_bytes;
  a.y += s * a.y_stride;
  if (a.bias) a.bias += e * a.n_out;
  if (a.expert_scale) a.scale = a.expert_scale[e];
  return s / a.x_div;
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

// The end of every matrix-vector kernel: a warp's NT partial sums of one row, reduced across
// the lanes, through the epilogue into y.
template <int NT>
__device__ __forceinline__ void store_row(const Args& a, int64_t row, const float (&acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (threadIdx.x % 32 == 0) {
      float* y = a.y + t * a.y_stride + row;
      // The residual read before y is written: they may be the same element.
      *y = a.residual ? epilogue(a, row, v) + a.residual[t * a.y_stride + row] : epilogue(a, row, v);
    }
  }
}

template <int T, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) matvec_kernel(Args a) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.n_out) return;
  a.x += select_slot(a) * a.x_stride;
  const uint8_t* wr = a.w + row * a.row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if constexpr (kIsPlain<T>) {
    // 8 elements per lane per step while whole 8-groups remain, then a scalar tail.
    const int64_t n8 = (a.n_in % 8 == 0 && a.x_stride % 4 == 0) ? a.n_in / 8 : 0;
    for (int64_t g = lane; g < n8; g += 32) {
      float w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = plain_at<T>(wr, g * 8 + i);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(a.x + t * a.x_stride + g * 8);
        const float4 x0 = xp[0], x1 = xp[1];
        acc[t] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y +
                  w[6] * x1.z + w[7] * x1.w;
      }
    }
    for (int64_t i = n8 * 8 + lane; i < a.n_in; i += 32) {
      const float w = plain_at<T>(wr, i);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] += w * a.x[t * a.x_stride + i];
    }
  } else {
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

// Rows [r0, r0 + n_rows) of W -> f16 [n_rows][n_in].
template <int T>
__global__ void dequant_f16_kernel(const uint8_t* w, size_t row_bytes, int64_t n_in, int64_t r0, int64_t n_rows,
                                   __half* out) {
  if constexpr (kIsPlain<T>) {
    const int64_t n = n_rows * n_in;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
      const int64_t r = i / n_in, c = i % n_in;
      out[i] = __float2half(plain_at<T>(w + (r0 + r) * row_bytes, c));
    }
  } else {
    const int64_t n_sub = n_in / 32, n = n_rows * n_sub;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
      const int64_t r = i / n_sub, s = i % n_sub;
      float v[32];
      dequant32<T>(w + (r0 + r) * row_bytes, s, v);
      // Four 16-byte stores instead of sixteen 4-byte ones (v1): out is 16-byte aligned here
      // because n_in and the piece offset are multiples of 32 halves.
      alignas(16) __half2 h[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      uint4* o = reinterpret_cast<uint4*>(out + r * n_in + s * 32);
#pragma unroll
      for (int k = 0; k < 4; ++k) o[k] = reinterpret_cast<const uint4*>(h)[k];
    }
  }
}

// x [n_tok][x_stride] -> 16-bit [n_tok][n_in] (__half or __nv_bfloat16), rounded to nearest.
template <typename H>
__global__ void to_16bit_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, H* out) {
  const int64_t n = n_in * n_tok;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[(i / n_in) * x_stride + i % n_in];
    if constexpr (std::is_same_v<H, __half>) out[i] = __float2half_rn(v);
    else out[i] = __float2bfloat16_rn(v);
  }
}

__global__ void bias_scale_kernel(Args a, int64_t n_tok) {
  const int64_t n = a.n_out * n_tok;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / a.n_out, r = i % a.n_out;
    float* y = a.y + t * a.y_stride + r;
    *y = epilogue(a, r, *y);
  }
}

// The host's activation formats (quant/quant.h vec_dot_type), emulated value for value:
// kQ8Blocks = quantize_q8_0/q8_1 then dequantize (d rounded to f16), kQ8K = quantize_q8_k.
// kActDp4a: x quantized to int8 Q8_0 blocks plus f32 scales for the dp4a kernel;
// kActDp4aK: to int8 Q8_K blocks (f32 scale per 256, int sums per 32) for the K-quant one.
enum ActRound { kActNone, kActQ8Blocks, kActQ8K, kActF16, kActBF16, kActDp4a, kActDp4aK };

constexpr ActRound act_round_for(int type) {
  switch (type) {
    case kQ4_0: case kQ5_0: case kQ8_0: case kIQ4_NL: case kMXFP4: case kQ4_1: case kQ5_1: return kActQ8Blocks;
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: case kIQ4_XS: return kActQ8K;
    case kF16: return kActF16;
    case kBF16: return kActBF16;
    default: return kActNone;
  }
}

// f16/bf16 rounding: one thread per element.
__global__ void act_round_elem_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, bool bf16,
                                      float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_in * n_tok; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[(i / n_in) * x_stride + i % n_in];
    out[i] = bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
  }
}

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
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float a2 = __shfl_xor_sync(0xffffffffu, amax, off), m2 = __shfl_xor_sync(0xffffffffu, mx, off);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, off);
    if (a2 > amax || (a2 == amax && i2 < idx)) {
      amax = a2;
      mx = m2;
      idx = i2;
    }
  }
  return mx;
}

// Q8 blocks (32) and Q8_K blocks (256): one warp per block, lane j holding elements
// j + 32 k, so loads and stores are coalesced (v1 gave each thread a whole block and read it
// serially: 65 us per 4096 x 512 activation on the H200, 14% of a pp512 batch). The
// arithmetic is the host's, element for element; only the reductions are parallel, and
// max is exact in any order. Q8_K takes the signed value of the FIRST element of largest
// magnitude (the host's strict '>'), so ties break to the lowest index here too.
template <int BS>
__global__ void act_round_block_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, float* out) {
  constexpr int kPer = BS / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n_blk = n_in / BS;
  const int64_t g = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (g >= n_blk * n_tok) return;
  const int64_t t = g / n_blk, b = g % n_blk;
  const float* xs = x + t * x_stride + b * BS;
  float* o = out + t * n_in + b * BS;
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = xs[lane + 32 * k];
  if constexpr (BS == 32) {
    float amax = fabsf(v[0]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = __half2float(__float2half_rn(d));
    o[lane] = roundf(v[0] * id) * dh;
  } else {
    float amax;
    const float mx = q8k_signed_max(v, amax);
    if (amax == 0.0f) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) o[lane + 32 * k] = 0.0f;
      return;
    }
    const float iscale = -127.f / mx, d = 1 / iscale;
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[lane + 32 * k] = fminf(127.0f, rintf(iscale * v[k])) * d;
  }
}

void launch_act_round(const MatmulParams& p, ActRound kind) {
  if (kind == kActF16 || kind == kActBF16) {
    const int64_t n = p.n_in * p.n_tok;
    act_round_elem_kernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1 << 20)), 256, 0, p.stream>>>(
        p.x, p.x_stride, p.n_in, p.n_tok, kind == kActBF16, p.act_round);
  } else {
    const int64_t bs = kind == kActQ8Blocks ? 32 : 256;
    const int64_t n_warps = p.n_tok * (p.n_in / bs);
    const unsigned grid = static_cast<unsigned>((n_warps + 7) / 8);
    if (kind == kActQ8Blocks)
      act_round_block_kernel<32><<<grid, 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in, p.n_tok, p.act_round);
    else
      act_round_block_kernel<256><<<grid, 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in, p.n_tok, p.act_round);
  }
  FRINK_CUDA_CHECK_LAUNCH();
}

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 4));
}

// a0 for activation rows t0 on (x, y and residual advanced t0 rows).
Args args_at(const MatmulParams& p, Args a0, int64_t t0) {
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

template <int T>
void matvec_launch(const MatmulParams& p, const Args& a0) {
  const auto grid_x = static_cast<unsigned>((p.n_out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch_rows(p, a0, grid_x, [&](const Args& a, dim3 g, int64_t, bool four) {
    if (four) matvec_kernel<T, 4><<<g, kWarpsPerBlock * 32, 0, p.stream>>>(a);
    else matvec_kernel<T, 1><<<g, kWarpsPerBlock * 32, 0, p.stream>>>(a);
    FRINK_CUDA_CHECK_LAUNCH();
  });
}

// dp4a path (Q4_0, Q8_0; used when act_round is given): x is quantized once per matmul to
// int8 Q8_0 blocks with the host's rule (d = amax/127, q = roundf(x/d), d kept as f16), then
// one warp per row dots 4-byte chunks of weight quants with the int8 activation (__dp4a) and
// scales each 32-block by d_w * d_x (the host's vec_dot_q4_0_q8_0 / q8_0_q8_0 arithmetic).
// One warp per Q8 block: lane j quantizes element j. xq: [n_tok][n_in] int8, xd: [n_tok][n_in/32].
__global__ void quantize_q8_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, int8_t* xq,
                                   float* xd) {
  const int lane = threadIdx.x % 32;
  const int64_t n_blk = n_in / 32;
  const int64_t g = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (g >= n_blk * n_tok) return;
  const int64_t t = g / n_blk, b = g % n_blk;
  const float v = x[t * x_stride + b * 32 + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127, id = d != 0.0f ? 1.0f / d : 0.0f;
  xq[t * n_in + b * 32 + lane] = static_cast<int8_t>(roundf(v * id));
  if (lane == 0) xd[t * n_blk + b] = __half2float(__float2half_rn(d));
}

__device__ __forceinline__ int ld_i32_a2(const uint8_t* p) {  // 2-byte aligned int load
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16));
}

void launch_quantize_q8(const MatmulParams& p, int8_t* xq, float* xd) {
  const int64_t n_warps = p.n_tok * (p.n_in / 32);
  quantize_q8_kernel<<<static_cast<unsigned>((n_warps + 7) / 8), 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in, p.n_tok,
                                                                                     xq, xd);
  FRINK_CUDA_CHECK_LAUNCH();
}

// dp4a path for Q4_K and Q6_K (the types of a Q4_K_M file), used when act_round is given: x is
// quantized once per matmul to int8 Q8_K blocks with the host's rule (iscale = -127 / the
// signed value of largest magnitude, q = min(127, rint(iscale x)), d = 1 / iscale), and the
// kernels do the host's vec_dot_q4_K_q8_K / q6_K_q8_K arithmetic: integer dots per sub-block
// weighted by the integer sub-block scales, one float scale per super-block, Q4_K's min term
// from the activation's per-32 sums. v1 (the generic kernel: dequantize to f32, round x to
// Q8_K values in f32, f32 FMAs) read 4 bytes of activation per weight element.
//
// Activation layout in act_round (bytes): int8 q [n_tok][n_in], then float d [n_tok][n_in/256],
// then int32 sum [n_tok][n_in/32]: at most 1.14 bytes per element of the 4 available.
struct Q8KAct {
  int8_t* q;
  float* d;
  int32_t* sum;
  // The same layout from activation row r on.
  __host__ __device__ Q8KAct at_row(int64_t r, int64_t n_in) const {
    return {q + r * n_in, d + r * (n_in / 256), sum + r * (n_in / 32)};
  }
};

Q8KAct q8k_act(const MatmulParams& p) {
  int8_t* q = reinterpret_cast<int8_t*>(p.act_round);
  float* d = reinterpret_cast<float*>(q + p.n_tok * p.n_in);
  int32_t* sum = reinterpret_cast<int32_t*>(d + p.n_tok * (p.n_in / 256));
  return {q, d, sum};
}

__device__ __forceinline__ int warp_isum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per 256-block; lane j holds elements j + 32 k, so element sub-block (32) k is the
// warp's k-th column and its sum one warp reduction.
__global__ void quantize_q8k_kernel(const float* x, int64_t x_stride, int64_t n_in, int64_t n_tok, Q8KAct a) {
  const int lane = threadIdx.x % 32;
  const int64_t n_blk = n_in / 256;
  const int64_t g = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (g >= n_blk * n_tok) return;
  const int64_t t = g / n_blk, b = g % n_blk;
  const float* xs = x + t * x_stride + b * 256;
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = xs[lane + 32 * k];
  float amax;
  const float mx = q8k_signed_max(v, amax);
  int8_t* q = a.q + t * n_in + b * 256;
  int32_t* sum = a.sum + t * (n_in / 32) + b * 8;
  const float iscale = amax == 0.0f ? 0.0f : -127.f / mx;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int qi = amax == 0.0f ? 0 : static_cast<int>(fminf(127.0f, rintf(iscale * v[k])));
    q[lane + 32 * k] = static_cast<int8_t>(qi);
    const int s = warp_isum(qi);
    if (lane == 0) sum[k] = s;
  }
  if (lane == 0) a.d[t * n_blk + b] = amax == 0.0f ? 0.0f : 1 / iscale;
}

__device__ __forceinline__ int ld_i32(const int8_t* p) { return *reinterpret_cast<const int*>(p); }

void launch_quantize_q8k(const MatmulParams& p, const Q8KAct& x) {
  const int64_t n_warps = p.n_tok * (p.n_in / 256);
  quantize_q8k_kernel<<<static_cast<unsigned>((n_warps + 7) / 8), 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in, p.n_tok,
                                                                                      x);
  FRINK_CUDA_CHECK_LAUNCH();
}

// Staged matrix-vector kernels (v3). The profile of v2 (H200, 8B Q4_0 decode, ncu): the dp4a
// kernels read weights at 1.42 TB/s, 33% of the 4.3 TB/s bound: each lane issued 2- and
// 4-byte loads at 18/34/210-byte block strides, so few bytes were in flight per warp. Here a
// warp copies its row in chunks of whole blocks (kStagedBlocks: a multiple of 16 bytes) with
// 16-byte cp.async into shared memory, two chunks in flight (the next chunk's copy runs
// while the current one is computed), and the lanes then run v2's block arithmetic on the
// shared copy. Rows must start 16-byte aligned (row_bytes % 16 == 0; staged_ok); others keep
// v2. kSWarps rows per block: four, so the 1024-row K/V products still fill 132 SMs.
constexpr int kSWarps = 4;

// Per type: kBlocks blocks of kBlockBytes bytes (kBlockElems elements) per staged chunk.
template <int T, int Blocks>
struct StagedGeom {
  static constexpr bool kPlain = T == kBF16 || T == kF16;
  static constexpr int kBlocks = Blocks;
  static constexpr int kBlockBytes = kPlain ? 2 : BlockGeom<kPlain ? kQ4_0 : T>::kBytes;
  static constexpr int kBlockElems = kPlain ? 1 : BlockGeom<kPlain ? kQ4_0 : T>::kElems;
  static constexpr int kChunk = kBlocks * kBlockBytes;
  static_assert(kChunk % 16 == 0, "chunks are copied 16 bytes at a time");
};
template <int T> struct Staged;
template <> struct Staged<kQ4_0> : StagedGeom<kQ4_0, 64> {};  // 1152 bytes
template <> struct Staged<kQ8_0> : StagedGeom<kQ8_0, 32> {};  // 1088 bytes
template <> struct Staged<kQ4_K> : StagedGeom<kQ4_K, 8> {};   // 1152 bytes
template <> struct Staged<kQ6_K> : StagedGeom<kQ6_K, 8> {};   // 1680 bytes
template <> struct Staged<kBF16> : StagedGeom<kBF16, 512> {}; // 1024 bytes
template <> struct Staged<kF16> : StagedGeom<kF16, 512> {};

// The activation each family reads: int8 Q8_0 blocks (Q4_0, Q8_0), Q8_K blocks (Q4_K, Q6_K)
// or f32 rows already rounded to the weights' 16-bit format (F16, BF16).
struct StagedAct {
  const int8_t* q8;
  const float* d8;
  Q8KAct q8k;
  const float* x;
};

__device__ __forceinline__ float h2f_a2(const uint8_t* p) { return __half2float(__ushort_as_half(ld_u16(p))); }

// Blocks [b0, b0 + nb) of R rows whose bytes start at s + r * rs (shared memory for the
// staged kernel, the row itself for the direct one), into acc[r] (NT activation rows): the
// host's vec_dot_q4_0_q8_0 / q8_0_q8_0 / q4_K_q8_K / q6_K_q8_K arithmetic (integer dots per
// block or sub-block, then the float scales; Q4_K's min term from the activation's per-32
// sums). A lane loads its activation once for all R rows: v3 with R = 1 spent more load
// instructions on the activation than on the weights (Q4_0: 11 loads per 16 weights).
template <int T, int NT, int R>
__device__ __forceinline__ void blocks_dot(const Args& a, const StagedAct& x, const uint8_t* s, int64_t rs, int64_t b0,
                                           int nb, float (&acc)[R][NT]) {
  const int lane = threadIdx.x % 32;
  if constexpr (T == kQ4_0 || T == kQ8_0) {
    // Lanes per weight block: Q4_0 2 (bytes [8k, 8k + 8) of qs: elements 8k.. and 16 + 8k..),
    // Q8_0 4 (elements [8k, 8k + 8)). Activation pieces are 8-byte aligned: one int2 load each.
    constexpr int kLpb = T == kQ4_0 ? 2 : 4;
    constexpr int kBytes = BlockGeom<T>::kBytes;
    const int k = lane % kLpb;
    const int64_t n_blk = a.n_in / 32;
    for (int i = lane / kLpb; i < nb; i += 32 / kLpb) {
      const int64_t ib = b0 + i;
      int2 u0[NT], u1[NT];
      float dx[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int2* u = reinterpret_cast<const int2*>(x.q8 + t * a.n_in + ib * 32);
        u0[t] = u[k];
        if constexpr (T == kQ4_0) u1[t] = u[2 + k];
        dx[t] = x.d8[t * n_blk + ib];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = s + r * rs + i * kBytes;
        const float dw = h2f_a2(b);
        const int v0 = ld_i32_a2(b + 2 + 8 * k), v1 = ld_i32_a2(b + 6 + 8 * k);
        if constexpr (T == kQ4_0) {
          const int w0 = __vsub4(v0 & 0x0F0F0F0F, 0x08080808), w1 = __vsub4(v1 & 0x0F0F0F0F, 0x08080808);
          const int w2 = __vsub4((v0 >> 4) & 0x0F0F0F0F, 0x08080808), w3 = __vsub4((v1 >> 4) & 0x0F0F0F0F, 0x08080808);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            int sum = __dp4a(w0, u0[t].x, 0);
            sum = __dp4a(w1, u0[t].y, sum);
            sum = __dp4a(w2, u1[t].x, sum);
            sum = __dp4a(w3, u1[t].y, sum);
            acc[r][t] += static_cast<float>(sum) * (dw * dx[t]);
          }
        } else {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const int sum = __dp4a(v1, u0[t].y, __dp4a(v0, u0[t].x, 0));
            acc[r][t] += static_cast<float>(sum) * (dw * dx[t]);
          }
        }
      }
    }
  } else if constexpr (T == kQ4_K) {
    // 8 lanes per 144-byte super-block; lane k takes qs bytes [16k, 16k + 16) (one 16-byte
    // load: a super-block starts 16-byte aligned, and its qs at +16), i.e. elements l in
    // [16 (k % 2), + 16) of sub-blocks 2 (k / 2) (low nibbles) and 2 (k / 2) + 1 (high nibbles).
    const int k = lane % 8, g = k / 2, l0 = 16 * (k % 2);
    const int64_t n_sb = a.n_in / 256;
    for (int i = lane / 8; i < nb; i += 4) {
      const int64_t ib = b0 + i;
      int4 xlo[NT], xhi[NT];
      float dx[NT];
      int xs0[NT], xs1[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = x.q8k.q + t * a.n_in + ib * 256;
        xlo[t] = *reinterpret_cast<const int4*>(xq + 32 * (2 * g) + l0);
        xhi[t] = *reinterpret_cast<const int4*>(xq + 32 * (2 * g + 1) + l0);
        dx[t] = x.q8k.d[t * n_sb + ib];
        const int32_t* xs = x.q8k.sum + t * (a.n_in / 32) + ib * 8;
        xs0[t] = xs[2 * g];
        xs1[t] = xs[2 * g + 1];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = s + r * rs + i * 144;
        const float dw = h2f_a2(b), dminw = h2f_a2(b + 2);
        int sc_lo, m_lo, sc_hi, m_hi;
        scale_min_k4(2 * g, b + 4, sc_lo, m_lo);
        scale_min_k4(2 * g + 1, b + 4, sc_hi, m_hi);
        const int4 qv = *reinterpret_cast<const int4*>(b + 16 + 16 * k);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          int s_lo = __dp4a(qv.x & 0x0F0F0F0F, xlo[t].x, 0), s_hi = __dp4a((qv.x >> 4) & 0x0F0F0F0F, xhi[t].x, 0);
          s_lo = __dp4a(qv.y & 0x0F0F0F0F, xlo[t].y, s_lo);
          s_hi = __dp4a((qv.y >> 4) & 0x0F0F0F0F, xhi[t].y, s_hi);
          s_lo = __dp4a(qv.z & 0x0F0F0F0F, xlo[t].z, s_lo);
          s_hi = __dp4a((qv.z >> 4) & 0x0F0F0F0F, xhi[t].z, s_hi);
          s_lo = __dp4a(qv.w & 0x0F0F0F0F, xlo[t].w, s_lo);
          s_hi = __dp4a((qv.w >> 4) & 0x0F0F0F0F, xhi[t].w, s_hi);
          const int summ = k % 2 == 0 ? m_lo * xs0[t] + m_hi * xs1[t] : 0;  // once per sub-block pair
          acc[r][t] += (dx[t] * dw) * static_cast<float>(sc_lo * s_lo + sc_hi * s_hi) -
                       (dx[t] * dminw) * static_cast<float>(summ);
        }
      }
    }
  } else if constexpr (T == kQ6_K) {
    // 16 lanes per 210-byte super-block (2-byte aligned: 2-byte loads); lane k takes half
    // h = k / 8 and elements l in [l4, l4 + 4), l4 = 4 (k % 8), of each quarter (+0, +32, +64,
    // +96) of that half: 4 bytes of ql at l4 and at 32 + l4, 4 bytes of qh at l4. Element
    // e = 128 h + 32 j + l lies in 16-element sub-block 8 h + 2 j + l4 / 16.
    const int k = lane % 16, h = k / 8, l4 = 4 * (k % 8);
    const int64_t n_sb = a.n_in / 256;
    for (int i = lane / 16; i < nb; i += 2) {
      const int64_t ib = b0 + i;
      int xv[NT][4];
      float dx[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = x.q8k.q + t * a.n_in + ib * 256 + 128 * h + l4;
#pragma unroll
        for (int j = 0; j < 4; ++j) xv[t][j] = ld_i32(xq + 32 * j);
        dx[t] = x.q8k.d[t * n_sb + ib];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = s + r * rs + i * 210;
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float dw = h2f_a2(b + 208);
        const int qa = ld_i32_a2(ql + l4), qb = ld_i32_a2(ql + 32 + l4), qhw = ld_i32_a2(qh + l4);
        // Six-bit values 0..63 per byte, minus 32 per byte (__vsub4 wraps per byte: two's complement int8).
        const int w[4] = {static_cast<int>(__vsub4((qa & 0x0F0F0F0F) | ((qhw << 4) & 0x30303030), 0x20202020)),
                          static_cast<int>(__vsub4((qb & 0x0F0F0F0F) | ((qhw << 2) & 0x30303030), 0x20202020)),
                          static_cast<int>(__vsub4(((qa >> 4) & 0x0F0F0F0F) | (qhw & 0x30303030), 0x20202020)),
                          static_cast<int>(__vsub4(((qb >> 4) & 0x0F0F0F0F) | ((qhw >> 2) & 0x30303030), 0x20202020))};
        int scj[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) scj[j] = sc[8 * h + 2 * j + l4 / 16];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          int sumi = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) sumi += scj[j] * __dp4a(w[j], xv[t][j], 0);
          acc[r][t] += (dx[t] * dw) * static_cast<float>(sumi);
        }
      }
    }
  } else {  // F16 / BF16: 8 elements (16 bytes) per lane step; x rows are f32
    for (int g = lane; g < nb / 8; g += 32) {
      const int64_t e0 = b0 + 8 * g;
      float4 x0[NT], x1[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(x.x + t * a.x_stride + e0);
        x0[t] = xp[0];
        x1[t] = xp[1];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 raw = *reinterpret_cast<const uint4*>(s + r * rs + 16 * g);
        const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
        float w[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (T == kBF16) {
            w[2 * j] = __uint_as_float(u[j] << 16);
            w[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
          } else {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[j]));
            w[2 * j] = f.x;
            w[2 * j + 1] = f.y;
          }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t)
          acc[r][t] += w[0] * x0[t].x + w[1] * x0[t].y + w[2] * x0[t].z + w[3] * x0[t].w + w[4] * x1[t].x +
                       w[5] * x1[t].y + w[6] * x1[t].z + w[7] * x1[t].w;
      }
    }
  }
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
constexpr int kStages = 2;  // items per warp in shared memory: kStages - 1 in flight
constexpr int kMaxSegs = 3;

struct Segs {
  Args a[kMaxSegs];
  int64_t g_end[kMaxSegs];  // end of each product's row pairs in the launch's index space
  int n;
};

template <int T, int NT>
__global__ void __launch_bounds__(kSWarps * 32) matvec_stream_kernel(Segs sg, StagedAct x) {
  constexpr int kChunk = Staged<T>::kChunk;
  __shared__ __align__(16) uint8_t sm[kSWarps][kStages][kSRows][kChunk];
  Args first = sg.a[0];  // expert mode (one product): select_slot points it at the slot's expert
  {
    const int64_t xr = select_slot(first);
    if constexpr (Staged<T>::kPlain) x.x += xr * first.x_stride;
    else if constexpr (T == kQ4_K || T == kQ6_K) x.q8k = x.q8k.at_row(xr, first.n_in);
    else {
      x.q8 += xr * first.n_in;
      x.d8 += xr * (first.n_in / 32);
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n_warps = int64_t{gridDim.x} * kSWarps, wg = int64_t{blockIdx.x} * kSWarps + warp;
  const int64_t n_groups = sg.g_end[sg.n - 1];
  if (wg >= n_groups) return;  // warp-uniform; no block-wide barrier below
  const int64_t n_blocks = first.n_in / Staged<T>::kBlockElems;
  const int64_t n_chunks = (n_blocks + Staged<T>::kBlocks - 1) / Staged<T>::kBlocks;
  const int64_t n_items = ((n_groups - 1 - wg) / n_warps + 1) * n_chunks;
  // Row pair g: its product's index and first row. (Returning a reference to `first` or to
  // sg.a would put `first` in local memory, read in the inner loop: products go by index.)
  auto locate = [&](int64_t g, int64_t& row0) {
    int seg = 0;
    while (g >= sg.g_end[seg]) ++seg;
    row0 = (g - (seg > 0 ? sg.g_end[seg - 1] : 0)) * kSRows;
    return seg;
  };
  auto chunk_blocks = [&](int64_t c) {
    return static_cast<int>(min(static_cast<int64_t>(Staged<T>::kBlocks), n_blocks - c * Staged<T>::kBlocks));
  };
  // Item it's rows into stage it % kStages: 16-byte copies, lanes strided (coalesced). A
  // product's odd last row pair copies its last row twice (computed, never stored).
  auto issue = [&](int64_t it) {
    if (it >= n_items) return;
    const int64_t c = it % n_chunks;
    int64_t row0;
    const int seg = locate(wg + (it / n_chunks) * n_warps, row0);
    const uint8_t* w = seg == 0 ? first.w : sg.a[seg].w;
    const size_t row_bytes = seg == 0 ? first.row_bytes : sg.a[seg].row_bytes;
    const int64_t n_out = seg == 0 ? first.n_out : sg.a[seg].n_out;
    const int bytes = chunk_blocks(c) * Staged<T>::kBlockBytes;
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
      const uint8_t* src =
          w + min(row0 + r, n_out - 1) * row_bytes + c * Staged<T>::kBlocks * Staged<T>::kBlockBytes;
      uint8_t* dst = sm[warp][it % kStages][r];
      for (int i = lane * 16; i < bytes; i += 32 * 16) __pipeline_memcpy_async(dst + i, src + i, 16);
    }
  };
  float acc[kSRows][NT];
#pragma unroll
  for (int r = 0; r < kSRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    issue(st);
    __pipeline_commit();
  }
  for (int64_t it = 0; it < n_items; ++it) {
    issue(it + kStages - 1);
    __pipeline_commit();                 // possibly empty: one group per item keeps the count simple
    __pipeline_wait_prior(kStages - 1);  // item it has landed (this lane's copies)
    __syncwarp();                        // ... and every lane's
    const int64_t c = it % n_chunks;
    blocks_dot<T, NT, kSRows>(first, x, sm[warp][it % kStages][0], kChunk, c * Staged<T>::kBlocks, chunk_blocks(c),
                              acc);
    __syncwarp();  // stage it % kStages is read by all lanes before item it + kStages overwrites it
    if (c == n_chunks - 1) {
      int64_t row0;
      const int seg = locate(wg + (it / n_chunks) * n_warps, row0);
#pragma unroll
      for (int r = 0; r < kSRows; ++r) {
        if (seg == 0) {
          if (row0 + r < first.n_out) store_row<NT>(first, row0 + r, acc[r]);
        } else if (row0 + r < sg.a[seg].n_out) {
          store_row<NT>(sg.a[seg], row0 + r, acc[r]);
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
      }
    }
  }
}

// Whether W's rows suit the staged kernels: 16-byte aligned starts (and expert stacks).
bool staged_ok(const MatmulParams& p) {
  return p.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && p.expert_bytes % 16 == 0 &&
         (p.type != kBF16 && p.type != kF16
              ? true
              : p.n_in % 8 == 0 && p.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0);
}

// The dp4a families on rows the staged kernel cannot copy (not 16-byte aligned): the same
// block arithmetic straight from global memory, kSWarps rows per block.
template <int T, int NT>
__global__ void __launch_bounds__(kSWarps * 32) matvec_direct_kernel(Args a, StagedAct x) {
  {
    const int64_t xr = select_slot(a);
    if constexpr (T == kQ4_K || T == kQ6_K) x.q8k = x.q8k.at_row(xr, a.n_in);
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

// The activation of launch rows from t0 on.
template <int T>
StagedAct act_at(StagedAct x, int64_t t0, int64_t n_in) {
  if constexpr (Staged<T>::kPlain) return x;  // f32 rows: follow Args::x (args_at)
  else if constexpr (T == kQ4_K || T == kQ6_K) x.q8k = x.q8k.at_row(t0, n_in);
  else {
    x.q8 += t0 * n_in;
    x.d8 += t0 * (n_in / 32);
  }
  return x;
}

// Products ps[0, n) of one input (and type) on the stream kernel, or one product at a time
// on the direct kernel when its rows cannot be staged (staged_ok). Expert mode: n == 1.
template <int T>
void matvec_dp4a_launch(const MatmulParams* ps, int n, const StagedAct& x0) {
  const MatmulParams& p = ps[0];
  bool staged = true;
  for (int i = 0; i < n; ++i) staged = staged && staged_ok(ps[i]);
  if (!staged) {
    if constexpr (!Staged<T>::kPlain) {  // plain types without staging take matvec_kernel (dispatch)
      for (int i = 0; i < n; ++i)
        launch_rows(ps[i], args_of(ps[i]), static_cast<unsigned>((ps[i].n_out + kSWarps - 1) / kSWarps),
                    [&](const Args& a, dim3 g, int64_t t0, bool four) {
                      StagedAct x = act_at<T>(x0, t0, p.n_in);
                      if constexpr (Staged<T>::kPlain) x.x = a.x;
                      if (four) matvec_direct_kernel<T, 4><<<g, kSWarps * 32, 0, p.stream>>>(a, x);
                      else matvec_direct_kernel<T, 1><<<g, kSWarps * 32, 0, p.stream>>>(a, x);
                      FRINK_CUDA_CHECK_LAUNCH();
                    });
    }
    return;
  }
  Segs sg{};
  sg.n = n;
  int64_t groups = 0;
  for (int i = 0; i < n; ++i) {
    sg.a[i] = args_of(ps[i]);
    groups += (ps[i].n_out + kSRows - 1) / kSRows;
    sg.g_end[i] = groups;
  }
  // Grid: one warp per row pair. (v4 filled the GPU once with the resident warps, each
  // walking several row pairs with 3 stages: slower on every product but the grouped q/k/v;
  // each warp's arithmetic, not the number of loads in flight, was then the limit.)
  auto grid_x = [&](int64_t, bool) { return static_cast<unsigned>((groups + kSWarps - 1) / kSWarps); };
  auto launch = [&](const Segs& s, dim3 g, int64_t t0, bool four) {
    StagedAct x = act_at<T>(x0, t0, p.n_in);
    if constexpr (Staged<T>::kPlain) x.x = s.a[0].x;
    if (four) matvec_stream_kernel<T, 4><<<g, kSWarps * 32, 0, p.stream>>>(s, x);
    else matvec_stream_kernel<T, 1><<<g, kSWarps * 32, 0, p.stream>>>(s, x);
    FRINK_CUDA_CHECK_LAUNCH();
  };
  if (p.slot_expert) {
    launch_rows(p, sg.a[0], grid_x(std::min<int64_t>(p.n_slots, 65535), false),
                [&](const Args& a, dim3 g, int64_t t0, bool four) {
                  Segs s = sg;
                  s.a[0] = a;
                  launch(s, g, t0, four);
                });
    return;
  }
  for (int64_t t0 = 0; t0 < p.n_tok;) {  // launch_rows' token chunks, for every product at once
    const bool four = p.n_tok - t0 >= 4;
    Segs s = sg;
    for (int i = 0; i < n; ++i) s.a[i] = args_at(ps[i], sg.a[i], t0);
    launch(s, dim3(grid_x(1, four)), t0, four);
    t0 += four ? 4 : 1;
  }
}

void blas_check(cublasStatus_t st, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) cuda_failed("cublasGemmEx", cublasGetStatusString(st), file, line);
}

template <int T>
void gemm_launch(const MatmulParams& p, const Args& a, bool x_ready) {
  FRINK_CUDA_CHECK(p.blas ? cudaSuccess : cudaErrorInvalidValue);
  const size_t x_elems = static_cast<size_t>(p.n_in * p.n_tok);
  FRINK_CUDA_CHECK(p.scratch_elems > x_elems + static_cast<size_t>(p.n_in) ? cudaSuccess : cudaErrorInvalidValue);
  __half* xh = static_cast<__half*>(p.scratch);
  __half* wh = xh + x_elems;
  const int64_t tile_rows = std::max<int64_t>(1, static_cast<int64_t>((p.scratch_elems - x_elems) / p.n_in));
  const float one = 1.0f, zero = 0.0f;
  if constexpr (T == kF32) {
    // f32 weights (small checkpoints, test fixtures) as they are, in f32: an f16 copy of
    // weights and activations cost the hf qwen3-next fixture NMSE 7.5e-5 of its 1e-4 budget.
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, CUDA_R_32F, static_cast<int>(p.row_bytes / sizeof(float)),
                            p.x, CUDA_R_32F, static_cast<int>(p.x_stride), &zero, p.y, CUDA_R_32F,
                            static_cast<int>(p.y_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else if constexpr (T == kF16 || T == kBF16) {
    // 16-bit weights go to cuBLAS as they are: no dequantized copy to write and read back
    // (the quantized types' tiles below), and bf16 keeps its exponent range (an f16 copy of
    // a bf16 weight or activation could overflow). x in the weights' format.
    using H = std::conditional_t<T == kF16, __half, __nv_bfloat16>;
    H* xw = static_cast<H*>(p.scratch);
    if (!x_ready) {  // else the group's previous product left x in this format at the scratch's start
      to_16bit_kernel<H><<<grid_for(static_cast<int64_t>(x_elems), 256), 256, 0, p.stream>>>(p.x, p.x_stride, p.n_in,
                                                                                            p.n_tok, xw);
      FRINK_CUDA_CHECK_LAUNCH();
    }
    const cudaDataType dt = T == kF16 ? CUDA_R_16F : CUDA_R_16BF;
    blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n_out), static_cast<int>(p.n_tok),
                            static_cast<int>(p.n_in), &one, a.w, dt, static_cast<int>(p.row_bytes / sizeof(H)), xw, dt,
                            static_cast<int>(p.n_in), &zero, p.y, CUDA_R_32F, static_cast<int>(p.y_stride),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               __FILE__, __LINE__);
  } else {
    if (!x_ready) {  // else the group's previous product left x in f16 at the scratch's start
      to_16bit_kernel<__half><<<grid_for(static_cast<int64_t>(x_elems), 256), 256, 0, p.stream>>>(p.x, p.x_stride,
                                                                                                  p.n_in, p.n_tok, xh);
      FRINK_CUDA_CHECK_LAUNCH();
    }
    for (int64_t r0 = 0; r0 < p.n_out; r0 += tile_rows) {
      const int64_t nr = std::min(tile_rows, p.n_out - r0);
      const int64_t work = kIsPlain<T> ? nr * p.n_in : nr * (p.n_in / 32);
      dequant_f16_kernel<T><<<grid_for(work, 256), 256, 0, p.stream>>>(a.w, p.row_bytes, p.n_in, r0, nr, wh);
      FRINK_CUDA_CHECK_LAUNCH();
      // Column-major view: W rows are columns of a [n_in x nr] matrix; C = W^T X is [nr x n_tok]
      // with leading dimension y_stride, i.e. Y[t][r0 + r].
      blas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr), static_cast<int>(p.n_tok),
                              static_cast<int>(p.n_in), &one, wh, CUDA_R_16F, static_cast<int>(p.n_in), xh, CUDA_R_16F,
                              static_cast<int>(p.n_in), &zero, p.y + r0, CUDA_R_32F, static_cast<int>(p.y_stride),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 __FILE__, __LINE__);
    }
  }
  if (p.bias || p.scale != 1.0f) {
    bias_scale_kernel<<<grid_for(p.n_out * p.n_tok, 256), 256, 0, p.stream>>>(a, p.n_tok);
    FRINK_CUDA_CHECK_LAUNCH();
  }
}

// The matrix-vector kernels serve decode batches and every expert product (one activation
// row per slot); other batches go to cuBLAS.
bool takes_matvec(const MatmulParams& p) { return p.slot_expert || p.matvec_only || p.n_tok <= kMatvecMaxTok; }

// What x becomes before the kernels read it: the key under which a group of products on one
// input (launch_matmuls) prepares it once.
ActRound act_prep_for(const MatmulParams& p) {
  if (!p.act_round) return kActNone;
  if ((p.type == kQ4_0 || p.type == kQ8_0) && takes_matvec(p) && p.n_in % 32 == 0) return kActDp4a;
  if ((p.type == kQ4_K || p.type == kQ6_K) && takes_matvec(p) && p.n_in % 256 == 0) return kActDp4aK;
  return act_round_for(p.type);
}

// Whether p goes to the stream kernel (matvec_stream_kernel): one of its types on the
// matrix-vector path, rows it can stage. Consecutive such products of one type share a launch.
bool streams(const MatmulParams& p, ActRound kind) {
  const bool family = ((p.type == kQ4_0 || p.type == kQ8_0) && kind == kActDp4a) ||
                      ((p.type == kQ4_K || p.type == kQ6_K) && kind == kActDp4aK) ||
                      ((p.type == kF16 || p.type == kBF16) && takes_matvec(p));
  return family && staged_ok(p);
}

// Products ps[0, n) of one type and one activation preparation (n > 1 only when all stream).
// x_ready: the previous product of the group prepared x the same way (kind), so the act_round
// buffer (and on the cuBLAS path the f16 copy of x) already hold it.
template <int T>
void dispatch(const MatmulParams* ps, int n, ActRound kind, bool x_ready) {
  MatmulParams p = ps[0];
  if constexpr (T == kQ4_0 || T == kQ8_0) {
    if (kind == kActDp4a) {
      int8_t* xq = reinterpret_cast<int8_t*>(p.act_round);  // int8 quants, then the f32 block scales
      float* xd = reinterpret_cast<float*>(xq + p.n_tok * p.n_in);
      if (!x_ready) launch_quantize_q8(p, xq, xd);
      matvec_dp4a_launch<T>(ps, n, StagedAct{xq, xd, {}, nullptr});
      return;
    }
  }
  if constexpr (T == kQ4_K || T == kQ6_K) {
    if (kind == kActDp4aK) {
      const Q8KAct x = q8k_act(p);
      if (!x_ready) launch_quantize_q8k(p, x);
      matvec_dp4a_launch<T>(ps, n, StagedAct{nullptr, nullptr, x, nullptr});
      return;
    }
  }
  if (kind != kActNone) {
    if (!x_ready) launch_act_round(p, kind);
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
      matvec_dp4a_launch<T>(group, n, StagedAct{nullptr, nullptr, {}, p.x});
      return;
    }
  }
  const Args a = args_of(p);
  if (takes_matvec(p))
    matvec_launch<T>(p, a);
  else
    gemm_launch<T>(p, a, x_ready);
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

void launch_matmuls(const MatmulParams* ps, int n) {
  ActRound prev = kActNone;
  bool prev_bf16_copy = false, prev_matvec = false;
  for (int i = 0; i < n; ++i) {
    const MatmulParams& p = ps[i];
    const MatmulParams& p0 = ps[0];
    FRINK_CUDA_CHECK(p.n_in > 0 && p.n_out > 0 && p.n_tok > 0 && p.x_stride >= p.n_in && p.y_stride >= p.n_out &&
                             (!p.residual || (p.n_tok <= kMatvecMaxTok && !p.slot_expert)) &&
                             (!p.slot_expert || (p.n_slots > 0 && p.x_div >= 1 &&
                                                 p.n_tok == (p.n_slots + p.x_div - 1) / p.x_div)) &&
                             p.x == p0.x && p.x_stride == p0.x_stride && p.n_in == p0.n_in && p.n_tok == p0.n_tok &&
                             p.act_round == p0.act_round && p.scratch == p0.scratch && p.stream == p0.stream
                         ? cudaSuccess
                         : cudaErrorInvalidValue);
  }
  for (int i = 0; i < n; ++i) {
    const MatmulParams& p = ps[i];
    // Ready: the previous product prepared x the same way, and (cuBLAS path) left its 16-bit
    // copy in the same format: bf16 for BF16 weights, f16 for all others. The path is part of
    // the key: a matrix-vector product (matvec_only in a prefill group) leaves no 16-bit copy,
    // and a cuBLAS product after it read stale scratch (found by the delta-net work: NMSE 2).
    const ActRound kind = act_prep_for(p);
    const bool bf16_copy = p.type == kBF16, matvec = takes_matvec(p);
    const bool x_ready = i > 0 && kind == prev && bf16_copy == prev_bf16_copy && matvec == prev_matvec;
    prev = kind;
    prev_bf16_copy = bf16_copy;
    prev_matvec = matvec;
    // The run of products this launch takes: p alone, or with the next ones of its type
    // when all stream (their rows share one launch).
    int run = 1;
    // (Each product's own preparation: a matvec_only product streams, the cuBLAS ones after
    // it do not, though their types match.)
    if (streams(p, kind) && !p.slot_expert)
      while (run < kMaxSegs && i + run < n && ps[i + run].type == p.type && !ps[i + run].slot_expert &&
             act_prep_for(ps[i + run]) == kind && streams(ps[i + run], kind) &&
             takes_matvec(ps[i + run]) == takes_matvec(p))
        ++run;
#define FRINK_CASE(T)                      \
  if (p.type == T) {                       \
    dispatch<T>(ps + i, run, kind, x_ready); \
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
