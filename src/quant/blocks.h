// GGUF block layouts, byte for byte as ggml-common.h defines them, plus the small constant
// tables the formats are defined by. A frink-written file and a llama.cpp-written file
// must be interchangeable, so every struct carries a static_assert on its GGUF size.
// Scales are raw uint16_t half bits (see fp16.h), never a compiler half type, so the
// layout cannot depend on the compiler.
#pragma once

#include <cstdint>

namespace frink::quant {

inline constexpr int kQK = 32;    // elements per legacy block (Q4_0 ... Q8_1, IQ4_NL, MXFP4)
inline constexpr int kQK_K = 256; // elements per K-quant super-block (Q2_K ... Q8_K, IQ4_XS)
inline constexpr int kKScaleBytes = 12;  // Q4_K/Q5_K: 8 scales + 8 mins, 6 bits each

// x = d * (q - 8), q in [0, 16); element j in the low nibble of qs[j], j+16 in the high.
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockQ4_0) == 18);

// x = d * q + m, q in [0, 16).
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockQ4_1) == 20);

// x = d * (q - 16), q in [0, 32); bit j of qh is the fifth bit of element j.
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockQ5_0) == 22);

// x = d * q + m, q in [0, 32).
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockQ5_1) == 24);

// x = d * q, q in [-127, 127] (the quantizers never produce -128).
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
static_assert(sizeof(BlockQ8_0) == 34);

// Activation for Q4_1/Q5_1: s = d * sum(qs) carries the term the weight's offset m needs.
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[kQK]; };
static_assert(sizeof(BlockQ8_1) == 36);

// x = d * scale_j * q - dmin * min_j over 16 sub-blocks of 16; scales[j] = scale | min << 4.
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d; uint16_t dmin; };
static_assert(sizeof(BlockQ2_K) == 84);

// x = d * (scale_j - 32) * (q - 4*!hbit); 16 six-bit scales packed in 12 bytes.
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[12]; uint16_t d; };
static_assert(sizeof(BlockQ3_K) == 110);

// x = d * scale_j * q - dmin * min_j over 8 sub-blocks of 32 (get_scale_min_k4 unpacks).
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQK_K / 2]; };
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// x = d * scale_j * (q - 32), q six bits split as 4 low (ql) + 2 high (qh); 16 int8 scales.
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
static_assert(sizeof(BlockQ6_K) == 210);

// Activation for K-quants and IQ4_XS: a float scale and per-16 sums (for the mins terms).
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };
static_assert(sizeof(BlockQ8_K) == 292);

// x = d * kIq4nlValues[q].
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockIQ4_NL) == 18);

// x = d * (ls_j - 32) * kIq4nlValues[q], ls_j six bits: low 4 in scales_l, high 2 in scales_h.
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
static_assert(sizeof(BlockIQ4_XS) == 136);

// x = 2^(e-128) * kMxfp4Values[q] (E2M1 doubled; see e8m0_to_f32_half).
struct BlockMXFP4 { uint8_t e; uint8_t qs[kQK / 2]; };
static_assert(sizeof(BlockMXFP4) == 17);

// ggml-common.h kvalues_iq4nl: a non-linear 4-bit code book fitted to weight distributions.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// ggml-common.h kvalues_mxfp4: the E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6} times two, so
// they are integers an int8 dot product can use.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
// Bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3; bytes 8-11 hold the low nibbles of
// scale/min 4-7, whose top two bits ride in the spare top bits of bytes 0-7.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// Q3_K: the 16 six-bit scales (still offset by 32) from the 12 packed bytes.
inline void unpack_q3_k_scales(const uint8_t* packed, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>(low | (high << 4));
  }
}

}  // namespace frink::quant
