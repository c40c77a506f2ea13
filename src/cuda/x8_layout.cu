// Q4_0, Q8_0, Q4_K, Q5_K, Q6_K and MXFP4 rows reordered for the device (matmul.cuh: x8_type, repack_x8).
#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"
#include "cuda/matmul.cuh"

namespace frink::cuda {

namespace {

// One thread per group of 8 blocks of B bytes (an f16 d, then B - 2 bytes of quants): the
// group's 8 B bytes (16-byte words, the group starting 8 B g from a 16-byte aligned base) read,
// reordered in registers and written back in place. Block k's quant word h (bytes [16 h,
// 16 h + 16)) goes to 128 h + 16 k, its d to 8 (B - 2) + 2 k. Why words of 16 and not whole
// blocks: a Q8_0 lane loads its block's two words, and with each block's 32 bytes together
// each of the two loads of a group's 8 lanes touched all 8 of its sectors; so each reads 128
// contiguous bytes.
template <int B>
__global__ void repack_x8_kernel(uint8_t* w, int64_t n_groups) {
  constexpr int kGroup = 8 * B, kWords = kGroup / 16, kQuants = B - 2;
  static_assert(kGroup % 16 == 0 && kQuants % 16 == 0, "groups stay 16-byte aligned, quants whole words");
  const int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (g >= n_groups) return;
  uint4* p = reinterpret_cast<uint4*>(w + g * kGroup);
  uint4 in[kWords], out[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) in[i] = p[i];
  const uint8_t* b = reinterpret_cast<const uint8_t*>(in);
  uint8_t* o = reinterpret_cast<uint8_t*>(out);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
#pragma unroll
    for (int i = 0; i < kQuants; ++i) o[128 * (i / 16) + 16 * k + i % 16] = b[B * k + 2 + i];
    o[8 * kQuants + 2 * k] = b[B * k];
    o[8 * kQuants + 2 * k + 1] = b[B * k + 1];
  }
#pragma unroll
  for (int i = 0; i < kWords; ++i) p[i] = out[i];
}

// One block of 72 threads per Q4_K tile (8 super-blocks of 144 bytes: 72 16-byte words, the
// tile starting 1152 t from a 16-byte aligned base): thread o reads the word that output word o
// takes, and after the barrier writes it in place. Output words 0-7 are the super-blocks'
// headers (their word 0); word 8 + 32 h + 4 s + g is super-block s's qs word 2 g + h (qs bytes
// [32 g + 16 h, + 16), word 1 + 2 g + h of the super-block).
constexpr int kQ4KTileWords = BlockGeom<kQ4_KX8>::kBytes / 16;
__global__ void repack_q4_k_x8_kernel(uint8_t* w) {
  uint4* p = reinterpret_cast<uint4*>(w + int64_t{blockIdx.x} * BlockGeom<kQ4_KX8>::kBytes);
  const int o = threadIdx.x;
  int src;
  if (o < 8) {
    src = 9 * o;
  } else {
    const int h = (o - 8) / 32, s = (o - 8) % 32 / 4, g = (o - 8) % 4;
    src = 9 * s + 1 + 2 * g + h;
  }
  const uint4 v = p[src];
  __syncthreads();
  p[o] = v;
}

// One block of 88 threads per Q5_K tile (8 super-blocks of 176 bytes, 11 16-byte words each: the
// header, 2 of qh, 8 of qs), through shared memory: thread o writes output word o (BlockGeom<kQ5_KX8>):
// a header (o < 8), 16 bytes of two groups' fifth bits (o < 24: super-block (o - 8) / 2, groups
// 2 ((o - 8) % 2) and + 1) or a qs word as Q4_KX8 places it.
constexpr int kQ5KTileWords = BlockGeom<kQ5_KX8>::kBytes / 16;
__global__ void repack_q5_k_x8_kernel(uint8_t* w) {
  constexpr int kSbWords = BlockGeom<kQ5_K>::kBytes / 16;
  __shared__ uint4 in[kQ5KTileWords];
  uint4* p = reinterpret_cast<uint4*>(w + int64_t{blockIdx.x} * BlockGeom<kQ5_KX8>::kBytes);
  const int o = threadIdx.x;
  in[o] = p[o];
  __syncthreads();
  uint4 v;
  if (o < 8) {
    v = in[kSbWords * o];
  } else if (o < 24) {
    const int s = (o - 8) / 2;
    const uint8_t* qh = reinterpret_cast<const uint8_t*>(&in[kSbWords * s + 1]);
    uint32_t bits[4] = {};  // groups g0 and g0 + 1, words h = 0, 1 each
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      const int g = 2 * ((o - 8) % 2) + gi;
      for (int h = 0; h < 2; ++h)
        for (int q = 0; q < 4; ++q)
          for (int b = 0; b < 4; ++b)
            for (int lh = 0; lh < 2; ++lh)
              bits[2 * gi + h] |= ((qh[16 * h + 4 * q + b] >> (2 * g + lh)) & 1u) << q5k_x8_fifth_bit(q, b, lh);
    }
    v = make_uint4(bits[0], bits[1], bits[2], bits[3]);
  } else {
    const int h = (o - 24) / 32, s = (o - 24) % 32 / 4, g = (o - 24) % 4;
    v = in[kSbWords * s + 3 + 2 * g + h];
  }
  p[o] = v;
}

// One block per Q6_K tile (8 super-blocks of 210 bytes, 2-byte aligned inside the tile, so
// bytes, through shared memory and a barrier): output byte o takes input byte src(o) (the
// layout: dequant.cuh, BlockGeom<kQ6_KX8>).
__global__ void repack_q6_k_x8_kernel(uint8_t* w) {
  constexpr int kTile = BlockGeom<kQ6_KX8>::kBytes, kSb = BlockGeom<kQ6_K>::kBytes;
  __shared__ uint8_t in[kTile];
  uint8_t* p = w + int64_t{blockIdx.x} * kTile;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) in[i] = p[i];
  __syncthreads();
  for (int o = threadIdx.x; o < kTile; o += blockDim.x) {
    int src;
    if (o < 1536) {  // ql at l8 (part 0), ql at 32 + l8 (part 1), qh (part 2); s, half h, byte l
      const int part = o / 512, s = o % 512 / 64, h = o % 64 / 32, l = o % 32;
      src = kSb * s + (part == 2 ? 128 + 32 * h + l : 64 * h + 32 * part + l);
    } else if (o < 1664) {
      src = kSb * ((o - 1536) / 16) + 192 + (o - 1536) % 16;
    } else {
      src = kSb * ((o - 1664) / 2) + 208 + (o - 1664) % 2;
    }
    p[o] = in[src];
  }
}

// One thread per group of 16 MXFP4 blocks of a row (n_blk blocks, rows of row_bytes: the file's
// 17 n_blk bytes padded to 16): the group's 17 r bytes (r = 16 but in a row's last group) read,
// reordered to BlockGeom<kMXFP4X16>'s layout in registers and written back in place, 16 + 16 r
// bytes, which the row's padding holds (17 r rounded up to 16 for a last group).
__global__ void repack_mxfp4_x16_kernel(uint8_t* w, int64_t n_rows, size_t row_bytes, int n_blk) {
  constexpr int kGroup = 16, kWords = BlockGeom<kMXFP4X16>::kBytes / 16;  // 17
  const int groups = (n_blk + kGroup - 1) / kGroup;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_rows * groups) return;
  const int g = static_cast<int>(i % groups), r = min(kGroup, n_blk - kGroup * g);
  uint4* p = reinterpret_cast<uint4*>(w + (i / groups) * row_bytes + int64_t{BlockGeom<kMXFP4X16>::kBytes} * g);
  const int words_in = (BlockGeom<kMXFP4>::kBytes * r + 15) / 16;
  uint4 in[kWords];
#pragma unroll
  for (int k = 0; k < kWords; ++k) in[k] = k < words_in ? p[k] : make_uint4(0, 0, 0, 0);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(in);
  uint32_t out[4 * kWords] = {};
#pragma unroll
  for (int k = 0; k < kGroup; ++k) {
    if (k >= r) break;
    const uint8_t* blk = b + BlockGeom<kMXFP4>::kBytes * k;  // e, then qs[16]
    out[k / 4] |= static_cast<uint32_t>(blk[0]) << (8 * (k % 4));
    uint32_t q[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
      q[m] = blk[1 + 4 * m] | blk[2 + 4 * m] << 8 | blk[3 + 4 * m] << 16 | static_cast<uint32_t>(blk[4 + 4 * m]) << 24;
#pragma unroll
    for (int m = 0; m < 4; ++m) out[4 + 4 * k + m] = mxfp4_x16_word(q, m);
  }
#pragma unroll
  for (int k = 0; k < kWords; ++k)
    if (k <= r) p[k] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
}

}  // namespace

int x8_type(int type, int64_t n_in) {
  // Q4_K, measured (H200, 8B Q4_K_M graph ms per decode token, one call, alternating): as the
  // file holds it 2.348 / 2.347 (tg128 417.7 / 418.5), kQ4_KX8 2.308 / 2.310 (425.2 / 424.3).
  if (type == kQ4_K) return n_in % BlockGeom<kQ4_KX8>::kElems == 0 ? kQ4_KX8 : type;
  // Q6_K likewise (one call, alternating, graph ms as the file holds it -> kQ6_KX8): 8B Q4_K_M
  // 2.316 / 2.311 -> 2.296 / 2.301; qwen3-next Q4_K_M, 4 layers, 0.356 / 0.355 -> 0.346 / 0.346.
  if (type == kQ6_K) return n_in % BlockGeom<kQ6_KX8>::kElems == 0 ? kQ6_KX8 : type;
  // Q5_K likewise (Q4_K_M files' attn_qkv, Q5_K_M files' products), where the stream kernel
  // took them (one call, two rounds alternating, graph ms, 8 layers): llama3.1-8b Q5_K_M 0.723 /
  // 0.723 -> 0.683 / 0.686, qwen3-next-80b-a3b Q4_K_M 0.517 / 0.516 -> 0.510 / 0.510.
  if (type == kQ5_K) return n_in % BlockGeom<kQ5_KX8>::kElems == 0 ? kQ5_KX8 : type;
  // MXFP4 in groups of 16 blocks, any width (its rows are padded to 16 bytes: device_row_bytes),
  // so matvec_reg_kernel takes it where the stream kernel staged the 17-byte blocks, a lane's
  // codes five word loads and funnel shifts from shared memory. Measured (H200, gpt-oss-20b
  // MXFP4 8 layers, tg128 graph ms, one call, two rounds): 0.775 / 0.774 -> 0.706 / 0.707.
  if (type == kMXFP4) return kMXFP4X16;
  // Q4_0 and Q8_0 of any width: a row's last group partial in its padding (device_row_bytes).
  return type == kQ4_0 ? kQ4_0X8 : type == kQ8_0 ? kQ8_0X8 : type;
}

// Block rows padded to 16 bytes, so that the staged kernels (16-byte copies; q/k/v with RoPE in
// one launch) take them rather than the direct kernel's byte loads a lane: gpt-oss's 2880-wide
// Q8_0 rows (3060 bytes) and MXFP4 ones (1530), the 1408-wide expert down of DeepSeek-V2 and
// qwen2moe (Q4_0 792 bytes). Measured (H200, 8 layers, tg128 graph ms, one call, two rounds
// each): gpt-oss-20b MXFP4 0.981 / 0.980 -> 0.821 / 0.820, qwen1.5-moe-a2.7b Q4_0 0.420 / 0.420
// -> 0.412 / 0.412, deepseek-v2-lite Q4_0 1.071 / 1.075 -> 1.072 / 1.071 (the Q8_0 attention
// products were the gain; MXFP4 experts alone padded changed nothing).
size_t device_row_bytes(int type, int64_t n_in, size_t row_bytes) {
  if (type == kF32 || type == kF16 || type == kBF16) return row_bytes;
  // Q4_0 / Q8_0 rows of a partial 8-block group: whole groups, the last one's missing blocks
  // zeros (never read: the kernels stop at the row's last block), so the x8 layout and every
  // kernel reading it take them unchanged: gpt-oss's 2880-wide Q8_0 q/k/v (90 blocks) with
  // the neox RoPE in their launch, the 1408-wide Q4_0 expert down of DeepSeek-V2 and qwen2moe
  // on the narrow kernels. Measured (H200, 8 layers, tg128 graph ms, one call, two rounds; the
  // rows padded to 16 bytes -> to whole groups): gpt-oss-20b MXFP4 0.708 / 0.709 -> 0.659 /
  // 0.659, deepseek-v2-lite Q4_0 1.083 / 1.085 -> 0.833 / 0.838, qwen1.5-moe-a2.7b Q4_0 0.411 /
  // 0.412 -> 0.380 / 0.381.
  if ((type == kQ4_0 || type == kQ8_0) && n_in % 256 != 0) {
    const int g = type == kQ4_0 ? BlockGeom<kQ4_0X8>::kBytes : BlockGeom<kQ8_0X8>::kBytes;
    return static_cast<size_t>((n_in + 255) / 256) * static_cast<size_t>(g);
  }
  // (MXFP4X16's last partial group needs the 16-byte padding too.)
  return (row_bytes + 15) / 16 * 16;
}

void repack_x8(int type, void* w, size_t n_bytes, int64_t n_in, cudaStream_t stream) {
  if (type == kMXFP4) {
    const int64_t n_blk = n_in / 32;
    const size_t row_bytes = device_row_bytes(type, n_in, static_cast<size_t>(n_blk) * BlockGeom<kMXFP4>::kBytes);
    FRINK_CUDA_CHECK(n_in % 32 == 0 && n_in > 0 && n_bytes % row_bytes == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0
                         ? cudaSuccess
                         : cudaErrorInvalidValue);
    const auto n_rows = static_cast<int64_t>(n_bytes / row_bytes);
    const int64_t threads = n_rows * ((n_blk + 15) / 16);
    if (threads == 0) return;
    repack_mxfp4_x16_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
        static_cast<uint8_t*>(w), n_rows, row_bytes, static_cast<int>(n_blk));
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  const int group = type == kQ4_0   ? BlockGeom<kQ4_0X8>::kBytes
                    : type == kQ8_0 ? BlockGeom<kQ8_0X8>::kBytes
                    : type == kQ4_K ? BlockGeom<kQ4_KX8>::kBytes
                    : type == kQ5_K ? BlockGeom<kQ5_KX8>::kBytes
                    : type == kQ6_K ? BlockGeom<kQ6_KX8>::kBytes
                                    : 0;
  FRINK_CUDA_CHECK(group > 0 && n_bytes % group == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0
                       ? cudaSuccess
                       : cudaErrorInvalidValue);
  const auto n_groups = static_cast<int64_t>(n_bytes / group);
  if (n_groups == 0) return;
  if (type == kQ4_K || type == kQ5_K || type == kQ6_K) {
    FRINK_CUDA_CHECK(n_groups <= 0x7FFFFFFF ? cudaSuccess : cudaErrorInvalidValue);
    if (type == kQ4_K)
      repack_q4_k_x8_kernel<<<static_cast<unsigned>(n_groups), kQ4KTileWords, 0, stream>>>(static_cast<uint8_t*>(w));
    else if (type == kQ5_K)
      repack_q5_k_x8_kernel<<<static_cast<unsigned>(n_groups), kQ5KTileWords, 0, stream>>>(static_cast<uint8_t*>(w));
    else
      repack_q6_k_x8_kernel<<<static_cast<unsigned>(n_groups), 256, 0, stream>>>(static_cast<uint8_t*>(w));
    FRINK_CUDA_CHECK_LAUNCH();
    return;
  }
  constexpr int kThreads = 256;
  const auto grid = static_cast<unsigned>((n_groups + kThreads - 1) / kThreads);
  if (type == kQ4_0) repack_x8_kernel<BlockGeom<kQ4_0>::kBytes><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), n_groups);
  else repack_x8_kernel<BlockGeom<kQ8_0>::kBytes><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), n_groups);
  FRINK_CUDA_CHECK_LAUNCH();
}

}  // namespace frink::cuda
