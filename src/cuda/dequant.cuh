// Device decoders of GGUF blocks, one 32-element piece at a time: dequant32<T>(row, s, out)
// writes elements [32 s, 32 s + 32) of a weight row. Formulas and operation order follow
// the host reference (src/quant/dequant.cpp), so a device product differs from the host
// one only in summation order and in the host's 8-bit activation rounding.
// Only for .cu files. Type ids are ggml's (GgmlType); layouts are src/quant/blocks.h's, read
// here by byte offset because blocks of 18/34/210 bytes are only 1- or 2-byte aligned.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace frink::cuda {

// ggml type ids this file decodes (the values of frink::GgmlType).
enum DevType : int {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23,
  kBF16 = 30, kMXFP4 = 39,
  // Q4_0, Q8_0, Q4_K, Q5_K and Q6_K as the device keeps them where rows are whole groups of 8
  // blocks or tiles of 8 super-blocks, MXFP4 in groups of 16 blocks (matmul.cuh, x8_type): no
  // GGUF types, so ids none has.
  kQ4_0X8 = 2000 + kQ4_0, kQ8_0X8 = 2000 + kQ8_0, kQ4_KX8 = 2000 + kQ4_K, kQ5_KX8 = 2000 + kQ5_K,
  kQ6_KX8 = 2000 + kQ6_K, kMXFP4X16 = 2000 + kMXFP4,
};
__host__ __device__ constexpr bool is_x8(int type) {
  return type == kQ4_0X8 || type == kQ8_0X8 || type == kQ4_KX8 || type == kQ5_KX8 || type == kQ6_KX8 ||
         type == kMXFP4X16;
}
template <int T> constexpr bool kIsX8 = is_x8(T);

__device__ __forceinline__ float h2f(const uint8_t* p) {
  const uint16_t bits = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// A 16-entry int8 code book (ggml's kvalues_iq4nl, kvalues_mxfp4) packed into four words, read
// by __byte_perm in registers. Why not __constant__ arrays: a warp's lanes index different
// entries, and constant memory serializes distinct addresses; gpt-oss-20b MXFP4's expert
// products took 114 us a launch (2 layers, 4 slots of 2880 x 2880, ncu, H200) that way.
constexpr uint32_t pack_s8x4(int a, int b, int c, int d) {
  return static_cast<uint32_t>(a & 0xFF) | static_cast<uint32_t>(b & 0xFF) << 8 |
         static_cast<uint32_t>(c & 0xFF) << 16 | static_cast<uint32_t>(d & 0xFF) << 24;
}
struct Iq4nlBook {
  static constexpr uint32_t w[4] = {pack_s8x4(-127, -104, -83, -65), pack_s8x4(-49, -35, -22, -10),
                                    pack_s8x4(1, 13, 25, 38), pack_s8x4(53, 69, 89, 113)};
};
struct Mxfp4Book {
  static constexpr uint32_t w[4] = {pack_s8x4(0, 1, 2, 3), pack_s8x4(4, 6, 8, 12), pack_s8x4(0, -1, -2, -3),
                                    pack_s8x4(-4, -6, -8, -12)};
};
// Entry q (0..15) of the book.
template <class Book>
__device__ __forceinline__ int book16(int q) {
  constexpr uint32_t w0 = Book::w[0], w1 = Book::w[1], w2 = Book::w[2], w3 = Book::w[3];
  const uint32_t lo = __byte_perm(w0, w1, static_cast<uint32_t>(q & 7));
  const uint32_t hi = __byte_perm(w2, w3, static_cast<uint32_t>(q & 7));
  return static_cast<int8_t>((q & 8 ? hi : lo) & 0xFF);
}

// Eight entries of the book at once, for dp4a: q8 holds eight 4-bit indices, nibble n of its
// low half (.x) and of its high half (.y) giving byte n of the result. __byte_perm reads its
// selector's nibbles as byte indices 0-7 (bit 3 ignored): the low and high halves of the book
// looked up for four indices at a time, then bit 3 picks between them (selector byte + 4). 10
// instructions for 8 entries, where a lookup of each byte's index did 4 entries in about 10
// (ncu: gpt-oss-20b's MXFP4 experts at 1.1 TB/s).
template <class Book>
__device__ __forceinline__ int2 book16_halves(uint32_t q8) {
  constexpr uint32_t w0 = Book::w[0], w1 = Book::w[1], w2 = Book::w[2], w3 = Book::w[3];
  const uint32_t pick = 0x32103210u | ((q8 >> 1) & 0x44444444u);  // 4 + byte where bit 3 is set
  uint32_t e[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t sel = q8 >> (16 * i);
    e[i] = __byte_perm(__byte_perm(w0, w1, sel), __byte_perm(w2, w3, sel), pick >> (16 * i));
  }
  return make_int2(static_cast<int>(e[0]), static_cast<int>(e[1]));
}

// The same for a block's own layout: byte j's low nibble is element j and its high nibble
// element j + 16, so .x is the entries of the four low nibbles and .y of the four high ones,
// byte j each (two byte permutes more put book16_halves' nibble order in element order).
template <class Book>
__device__ __forceinline__ int2 book16x8(uint32_t q8) {
  const int2 e = book16_halves<Book>(q8);
  return make_int2(static_cast<int>(__byte_perm(e.x, e.y, 0x6420)), static_cast<int>(__byte_perm(e.x, e.y, 0x7531)));
}

// MXFP4X16's code word m of a block (dequant.cuh's layout): nibble n < 4 of it is element 4 m +
// n, nibble 4 + n element 16 + 4 m + n, so book16_halves gives the dp4a words of activation
// words m and 4 + m as they are; from the file's 16 code bytes qs (words q[4]).
__host__ __device__ constexpr uint32_t mxfp4_x16_word(const uint32_t (&q)[4], int m) {
  uint32_t w = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t byte = (q[m] >> (8 * n)) & 0xFFu;  // qs[4 m + n]: elements 4 m + n, 16 + 4 m + n
    w |= (byte & 0xFu) << (4 * n) | (byte >> 4) << (16 + 4 * n);
  }
  return w;
}

// MXFP4's scale byte as the host's e8m0_to_f32_half: 2^(e - 128), the code book's values being
// doubled (subnormal for e < 2).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}

// Q4_K/Q5_K 6-bit scale and min of sub-block j (get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Two halves of a 16-byte nibble array: out[j] from the low nibbles, out[16 + j] from the high.
template <typename F>
__device__ __forceinline__ void nibbles(const uint8_t* qs, float* out, F f) {
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    const uint16_t w = ld_u16(qs + j);
    out[j] = f(w & 0xF);
    out[j + 1] = f((w >> 8) & 0xF);
    out[j + 16] = f((w >> 4) & 0xF);
    out[j + 17] = f(w >> 12);
  }
}

template <int T> struct BlockGeom;
template <> struct BlockGeom<kQ4_0> { static constexpr int kElems = 32, kBytes = 18; };
template <> struct BlockGeom<kQ4_1> { static constexpr int kElems = 32, kBytes = 20; };
template <> struct BlockGeom<kQ5_0> { static constexpr int kElems = 32, kBytes = 22; };
template <> struct BlockGeom<kQ5_1> { static constexpr int kElems = 32, kBytes = 24; };
template <> struct BlockGeom<kQ8_0> { static constexpr int kElems = 32, kBytes = 34; };
template <> struct BlockGeom<kQ2_K> { static constexpr int kElems = 256, kBytes = 84; };
template <> struct BlockGeom<kQ3_K> { static constexpr int kElems = 256, kBytes = 110; };
template <> struct BlockGeom<kQ4_K> { static constexpr int kElems = 256, kBytes = 144; };
template <> struct BlockGeom<kQ5_K> { static constexpr int kElems = 256, kBytes = 176; };
template <> struct BlockGeom<kQ6_K> { static constexpr int kElems = 256, kBytes = 210; };
template <> struct BlockGeom<kIQ4_NL> { static constexpr int kElems = 32, kBytes = 18; };
template <> struct BlockGeom<kIQ4_XS> { static constexpr int kElems = 256, kBytes = 136; };
template <> struct BlockGeom<kMXFP4> { static constexpr int kElems = 32, kBytes = 17; };
// A group of 8 Q4_0 / Q8_0 blocks: their quants, then their 8 f16 scales. The quants in 16-byte
// words, word h of block k at 128 h + 16 k (Q4_0: one word a block, so block k at 16 k).
template <> struct BlockGeom<kQ4_0X8> { static constexpr int kElems = 256, kBytes = 144; };
template <> struct BlockGeom<kQ8_0X8> { static constexpr int kElems = 256, kBytes = 272; };
// A group of 16 MXFP4 blocks: their 16 scale bytes, then their code words, block k's 16 bytes at
// 16 + 16 k (as 4 words mxfp4_x16_word orders). A row's last group may hold r < 16 blocks: its r
// scales padded to 16 bytes, then r code words, so the row is 16 (r + 1) bytes longer than its
// whole groups, which is what the device's rows padded to 16 bytes hold (17 r rounded up); and a
// block's place, 272 (b / 16) + b % 16 and + 16 + 16 (b % 16), needs no row width. Why 16
// blocks: a group of 8 (136 bytes) would leave every other group's codes 8-byte aligned.
template <> struct BlockGeom<kMXFP4X16> { static constexpr int kElems = 512, kBytes = 272; };
// A tile of 8 Q4_K super-blocks: their 16-byte headers (d, dmin, 12 scale bytes), then the
// quants in two halves: half h holds, for super-block s and group g (qs bytes [32 g, 32 g + 32)),
// bytes [32 g + 16 h, + 16) at 128 + 512 h + 64 s + 16 g.
template <> struct BlockGeom<kQ4_KX8> { static constexpr int kElems = 2048, kBytes = 1152, kQs = 128; };
// A tile of 8 Q5_K super-blocks: Q4_KX8's headers (at 16 s) and nibbles (at 384 + 512 h + 64 s +
// 16 g), between them each group's fifth bits as the decode lane of (s, g) uses them, 8 bytes at
// 128 + 32 s + 8 g: word h's byte b, bit 2 q + lh, is the fifth bit of element 16 h + 4 q + b of
// sub-block 2 g + lh (qh[16 h + 4 q + b] bit 2 g + lh), so the bits a dp4a word of nibbles takes
// are one shift and mask of the word away.
template <> struct BlockGeom<kQ5_KX8> { static constexpr int kElems = 2048, kBytes = 1408, kFifth = 128, kQs = 384; };
// Where that word keeps the fifth bit of element 16 h + 4 q + b of sub-block 2 g + lh: the one
// definition of the order for the repack (x8_layout.cu) and dequant8_x8 (the register kernel's
// at4 takes a dp4a word's four bits at once from the same order).
__host__ __device__ constexpr int q5k_x8_fifth_bit(int q, int b, int lh) { return 8 * b + 2 * q + lh; }
// A tile of 8 Q6_K super-blocks, in the runs the decode kernel's lanes read (lane part k = 4 h +
// l8 / 8 of super-block s: half h, elements l8 .. l8 + 7 of each quarter): ql bytes [64 h + l8,
// + 8) at 64 s + 8 k, ql bytes [64 h + 32 + l8, + 8) at 512 + 64 s + 8 k, qh bytes [32 h + l8,
// + 8) at 1024 + 64 s + 8 k; the 16 scales at 1536 + 16 s, d at 1664 + 2 s.
template <> struct BlockGeom<kQ6_KX8> { static constexpr int kElems = 2048, kBytes = 1680; };

// Elements [8 u, 8 u + 8) of a row in an x8 layout. The layouts put the quants of 8
// consecutive elements in 8 contiguous, 8-byte aligned bytes (Q6_K: its ql and its qh bytes),
// so a thread per 8 elements makes one load of them and a warp reads whole sectors
// (dequant_x8_f16_kernel); dequant32 of these types is four of these. Values and operation
// order are the plain layouts' (dequant32 of kQ4_0 ... kQ6_K).
template <int T>
__device__ __forceinline__ void dequant8_x8(const uint8_t* row, int64_t u, float* out) {
  using G = BlockGeom<T>;
  constexpr int kUnits = G::kElems / 8;
  const uint8_t* b = row + (u / kUnits) * G::kBytes;
  const int e = static_cast<int>(u % kUnits), j = e / 4, c = e % 4;  // 32-element piece j, its quarter c
  const auto bytes8 = [](const uint8_t* p, int k) {  // byte k of the aligned 8 at p
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    return static_cast<int>(((k < 4 ? w.x : w.y) >> (8 * (k % 4))) & 0xFF);
  };
  if constexpr (T == kQ4_0X8) {  // block j: low nibbles of bytes [0, 16) are elements [0, 16)
    const float d = h2f(b + 128 + 2 * j);
    const uint8_t* q = b + 16 * j + 8 * (c % 2);
    const int sh = c < 2 ? 0 : 4;
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = (((bytes8(q, k) >> sh) & 0xF) - 8) * d;
  } else if constexpr (T == kQ8_0X8) {  // block j's element l at 128 (l / 16) + 16 j + l % 16
    const float d = h2f(b + 256 + 2 * j);
    const uint8_t* q = b + 128 * (c / 2) + 16 * j + 8 * (c % 2);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = static_cast<int8_t>(bytes8(q, k)) * d;
  } else if constexpr (T == kQ4_KX8 || T == kQ5_KX8) {
    // Sub-block j % 8 of super-block j / 8: group g = j % 8 / 2, low (even) or high nibbles;
    // its element l at kQs + 512 (l / 16) + 64 sb + 16 g + l % 16 (Q5_K's fifth bit: BlockGeom).
    constexpr int kQs = G::kQs;
    const int sb = j / 8, jj = j % 8, g = jj / 2, sh = (jj % 2) * 4;
    const uint8_t* hd = b + 16 * sb;
    const float d = h2f(hd), dmin = h2f(hd + 2);
    int sc, mn;
    scale_min_k4(jj, hd + 4, sc, mn);
    const float d1 = d * sc, m1 = dmin * mn;
    const uint8_t* q = b + kQs + 512 * (c / 2) + 64 * sb + 16 * g + 8 * (c % 2);
    // Elements 16 h + 8 (c % 2) + k: word h = c / 2 of the group's bits, bit 2 q + lh of byte k % 4, q = 2 (c % 2) + k / 4.
    uint32_t fifth = 0;
    if constexpr (T == kQ5_KX8) fifth = *reinterpret_cast<const uint32_t*>(b + G::kFifth + 32 * sb + 8 * g + 4 * (c / 2));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int v = (bytes8(q, k) >> sh) & 0xF;
      if constexpr (T == kQ5_KX8) v += (fifth >> q5k_x8_fifth_bit(2 * (c % 2) + k / 4, k % 4, jj % 2)) & 1 ? 16 : 0;
      out[k] = __fsub_rn(__fmul_rn(d1, v), m1);
    }
  } else if constexpr (T == kMXFP4X16) {  // block j: scale byte j, code words at 16 + 16 j
    const float d = e8m0_half(b[j]);
    const uint2 w = *reinterpret_cast<const uint2*>(b + 16 + 16 * j + 8 * (c % 2));
    const int sh = 16 * (c / 2);  // elements 8 c..: words 2 (c % 2) and + 1, the low or high nibbles
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = book16<Mxfp4Book>(((k < 4 ? w.x : w.y) >> (sh + 4 * (k % 4))) & 0xF) * d;
  } else if constexpr (T == kQ6_KX8) {
    // Quarter qq of half `half` of super-block sb; its element l: ql byte at 512 (qq & 1) +
    // 64 sb + 32 half + l, qh byte at 1024 + 64 sb + 32 half + l.
    const int sb = j / 8, jj = j % 8, half = jj / 4, qq = jj % 4;
    const float d = h2f(b + 1664 + 2 * sb);
    const int sc = reinterpret_cast<const int8_t*>(b + 1536 + 16 * sb)[8 * half + c / 2 + 2 * qq];
    const uint8_t* ql = b + 512 * (qq & 1) + 64 * sb + 32 * half + 8 * c;
    const uint8_t* qh = b + 1024 + 64 * sb + 32 * half + 8 * c;
    const int lsh = (qq / 2) * 4, hsh = 2 * qq;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int q = (((bytes8(ql, k) >> lsh) & 0xF) | (((bytes8(qh, k) >> hsh) & 3) << 4)) - 32;
      out[k] = d * sc * q;
    }
  }
}

// Elements [32 s, 32 s + 32) of a quantized row.
template <int T>
__device__ __forceinline__ void dequant32(const uint8_t* row, int64_t s, float* out) {
  using G = BlockGeom<T>;
  constexpr int kSub = G::kElems / 32;
  const uint8_t* b = row + (s / kSub) * G::kBytes;
  const int j = static_cast<int>(s % kSub);
  if constexpr (kIsX8<T>) {
#pragma unroll
    for (int c = 0; c < 4; ++c) dequant8_x8<T>(row, 4 * s + c, out + 8 * c);
  } else if constexpr (T == kQ4_0) {
    const float d = h2f(b);
    nibbles(b + 2, out, [d](int q) { return (q - 8) * d; });
  } else if constexpr (T == kQ4_1) {
    const float d = h2f(b), m = h2f(b + 2);
    nibbles(b + 4, out, [d, m](int q) { return __fadd_rn(__fmul_rn(q, d), m); });
  } else if constexpr (T == kQ5_0 || T == kQ5_1) {
    constexpr int kOff = T == kQ5_0 ? 2 : 4;
    const float d = h2f(b), m = T == kQ5_1 ? h2f(b + 2) : 0.0f;
    const uint32_t qh = ld_u16(b + kOff) | (static_cast<uint32_t>(ld_u16(b + kOff + 2)) << 16);
    const uint8_t* qs = b + kOff + 4;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int h0 = ((qh >> l) << 4) & 0x10, h1 = (qh >> (l + 12)) & 0x10;
      const int q0 = (qs[l] & 0xF) | h0, q1 = (qs[l] >> 4) | h1;
      if constexpr (T == kQ5_0) {
        out[l] = (q0 - 16) * d;
        out[l + 16] = (q1 - 16) * d;
      } else {
        out[l] = __fadd_rn(__fmul_rn(q0, d), m);
        out[l + 16] = __fadd_rn(__fmul_rn(q1, d), m);
      }
    }
  } else if constexpr (T == kQ8_0) {
    const float d = h2f(b);
#pragma unroll
    for (int l = 0; l < 32; l += 2) {
      const uint16_t w = ld_u16(b + 2 + l);
      out[l] = static_cast<int8_t>(w & 0xFF) * d;
      out[l + 1] = static_cast<int8_t>(w >> 8) * d;
    }
  } else if constexpr (T == kQ2_K) {
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    const int half = j / 4, shift = 2 * (j % 4);
    const uint8_t* q = b + 16 + 32 * half;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const uint8_t sc = b[8 * half + 2 * (j % 4) + l / 16];
      out[l] = __fsub_rn(__fmul_rn(d * (sc & 0xF), (q[l] >> shift) & 3), dmin * (sc >> 4));
    }
  } else if constexpr (T == kQ3_K) {
    const float d_all = h2f(b + 108);
    const uint8_t* hm = b;
    const uint8_t* sc = b + 96;
    const int half = j / 4, shift = 2 * (j % 4);
    const uint8_t m = static_cast<uint8_t>(1u << (4 * half + j % 4));
    const uint8_t* q = b + 32 + 32 * half;
#pragma unroll
    for (int sub = 0; sub < 2; ++sub) {
      const int is = 8 * half + 2 * (j % 4) + sub;
      const int low = is < 8 ? sc[is] & 0xF : sc[is - 8] >> 4;
      const int high = (sc[8 + is % 4] >> (2 * (is / 4))) & 3;
      const float dl = d_all * ((low | (high << 4)) - 32);
#pragma unroll
      for (int l = 16 * sub; l < 16 * sub + 16; ++l)
        out[l] = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
    }
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    const float d = h2f(b), dmin = h2f(b + 2);
    int sc, mn;
    scale_min_k4(j, b + 4, sc, mn);
    const float d1 = d * sc, m1 = dmin * mn;
    const uint8_t* ql = b + (T == kQ4_K ? 16 : 48) + 32 * (j / 2);
    const int sh = (j % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int q = (ql[l] >> sh) & 0xF;
      if constexpr (T == kQ5_K) q += (b[16 + l] >> j) & 1 ? 16 : 0;
      out[l] = __fsub_rn(__fmul_rn(d1, q), m1);
    }
  } else if constexpr (T == kQ6_K) {
    const float d = h2f(b + 208);
    const int half = j / 4, qq = j % 4;
    const uint8_t* ql = b + 64 * half + (qq & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * half;
    const int lsh = (qq / 2) * 4, hsh = 2 * qq;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> lsh) & 0xF) | (((qh[l] >> hsh) & 3) << 4)) - 32;
      out[l] = d * sc[l / 16 + 2 * qq] * q;
    }
  } else if constexpr (T == kIQ4_NL) {
    const float d = h2f(b);
    nibbles(b + 2, out, [d](int q) { return d * book16<Iq4nlBook>(q); });
  } else if constexpr (T == kIQ4_XS) {
    const float d = h2f(b);
    const int scales_h = ld_u16(b + 2);
    const int ls = ((b[4 + j / 2] >> 4 * (j % 2)) & 0xF) | (((scales_h >> 2 * j) & 3) << 4);
    const float dl = d * (ls - 32);
    nibbles(b + 8 + 16 * j, out, [dl](int q) { return dl * book16<Iq4nlBook>(q); });
  } else if constexpr (T == kMXFP4) {
    const float d = e8m0_half(b[0]);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      out[l] = book16<Mxfp4Book>(b[1 + l] & 0xF) * d;
      out[l + 16] = book16<Mxfp4Book>(b[1 + l] >> 4) * d;
    }
  }
}

// One element of a plain (F32/F16/BF16) row.
template <int T>
__device__ __forceinline__ float plain_at(const uint8_t* row, int64_t i) {
  if constexpr (T == kF32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (T == kF16) return __half2float(reinterpret_cast<const __half*>(row)[i]);
  else return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[i]);
}

template <int T> constexpr bool kIsPlain = T == kF32 || T == kF16 || T == kBF16;

// Eight F16/BF16 elements from their 16 bytes.
template <int T>
__device__ __forceinline__ void plain8_of(const uint4& raw, float (&w)[8]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
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
}

// Elements [8 g, 8 g + 8) of a plain row: 16-byte loads where the row is 16-byte aligned
// (vec), else one element at a time.
template <int T>
__device__ __forceinline__ void plain8_at(const uint8_t* row, int64_t g, bool vec, float (&w)[8]) {
  if (vec) {
    if constexpr (T == kF32) {
      const float4* p = reinterpret_cast<const float4*>(row) + 2 * g;
      const float4 a = p[0], b = p[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
      plain8_of<T>(reinterpret_cast<const uint4*>(row)[g], w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = plain_at<T>(row, g * 8 + i);
  }
}

// Expands F(T) for every type with a device decoder: the ONE list, read by both
// matmul_supported() and the dispatch, so support and dispatch cannot disagree.
#define FRINK_FOR_EACH_DEVICE_TYPE(F)                                                      \
  F(kF32) F(kF16) F(kBF16) F(kQ4_0) F(kQ4_1) F(kQ5_0) F(kQ5_1) F(kQ8_0) F(kQ2_K) F(kQ3_K) \
  F(kQ4_K) F(kQ5_K) F(kQ6_K) F(kIQ4_NL) F(kIQ4_XS) F(kMXFP4) F(kQ4_0X8) F(kQ8_0X8) F(kQ4_KX8) F(kQ5_KX8) \
  F(kQ6_KX8) F(kMXFP4X16)

}  // namespace frink::cuda
