// Helpers shared by the x86 dot kernels (dot_x86_legacy.h, dot_x86_k.h). Included ONLY by
// dot_avx2.cpp and dot_avx512.cpp, which compile the same kernel bodies for two instruction
// sets. Everything here has internal linkage (anonymous namespace) and the kernels call no
// inline function with external linkage (not fp16.h, not std::min): the linker would keep
// ONE copy of such a function, possibly the AVX-512 one, and the scalar path would then
// fault on a CPU without AVX-512.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace frink::quant {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum_f32x8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline float hsum_f32x4(__m128 r) {
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// 32 nibbles in block element order: the low nibbles of the 16 bytes are elements 0..15,
// the high nibbles 16..31 (the layout of Q4_0, Q4_1, Q5_*, IQ4_NL, MXFP4).
inline __m256i nibbles_32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i b = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

// Byte i = 0xFF where bit i of the 32-bit word at p is set (Q5_0/Q5_1's fifth bits).
inline __m256i bits_32(const uint8_t* p) {
  uint32_t x32;
  std::memcpy(&x32, p, sizeof(x32));
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                         0x0101010101010101, 0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// 8 int32 lanes whose total is sum_k u[k] * s[k], u unsigned bytes, s signed bytes.
// maddubs saturates at int16: callers keep |u * s| * 2 <= 32767 (u <= 127 with |s| <= 127,
// or u <= 63 at any s). With AVX-512 VNNI one vpdpbusd does it without the int16 stage.
inline __m256i dot_us8_i32(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Same for two signed operands, by moving x's sign onto y (|x| <= 128, |y| <= 127).
inline __m256i dot_s8_i32(__m256i x, __m256i y) {
  return dot_us8_i32(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// 16 int16 lanes of pairwise u*s sums (no final widening) for the K-quant kernels, which
// then weight each pair by a sub-block scale with madd_epi16.
inline __m256i pairs_us8_i16(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

// acc + pairwise a*b of int16 lanes (one vpdpwssd with VNNI, madd + add without).
inline __m256i madd_acc_i16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

template <typename Block>
inline const Block* row_ptr(const void* w, size_t stride, int r) {
  return reinterpret_cast<const Block*>(static_cast<const char*>(w) + static_cast<size_t>(r) * stride);
}

}  // namespace
}  // namespace frink::quant
