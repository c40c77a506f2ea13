// x86 dot kernels for the 256-element super-block types against Q8_K (Q4_K, Q5_K, Q6_K,
// IQ4_XS); included by dot_avx2.cpp and dot_avx512.cpp only. Like dot_x86_legacy.h each is
// a template over R weight rows sharing one pass over the activation. The sub-block scales
// are applied in int16 x int16 -> int32 multiply-adds (madd), so each super-block needs
// ONE float multiply-add per row; the K-quant min and Q6_K's -32 offset are folded in once
// per super-block through Q8_K's bsums instead of per element.
#pragma once

#include <type_traits>

#include "quant/dot_x86_common.h"

namespace frink::quant {
namespace {

// Q4_K/Q5_K's 12 packed bytes as 16 int16 lanes: 0..7 the scales, 8..15 the mins
// (the same unpacking as get_scale_min_k4, four bytes at a time).
inline __m256i k4_scales_mins(const uint8_t* packed) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, kKScaleBytes);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_0_3 = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_0_3;
  u[0] &= kmask1;
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]),
                                            static_cast<int>(u[1]), static_cast<int>(u[0])));
}

// pshufb mask broadcasting int16 lane k of each 128-bit half.
inline __m256i broadcast_i16_mask(int k) { return _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * k)); }

// Q4_K (kFive = false) and Q5_K (kFive = true): sum over sub-blocks j of
// d*sc_j*dot(q, a) - dmin*m_j*sum(a); q in [0, 16) or [0, 32).
template <bool kFive, int R>
void k4_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc[R];
  __m128 acc_m[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_m[r] = _mm_setzero_ps();
  }
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m256i bsums = load256(y[i].bsums);
    // Sums of 32 activations, one per sub-block, for the mins term.
    const __m128i a_sums = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    const Block* b[R];
    __m256i scales[R], sumi[R];
    for (int r = 0; r < R; ++r) {
      b[r] = row_ptr<Block>(w, stride, r) + i;
      const __m256i sm = k4_scales_mins(b[r]->scales);
      const __m128i mins_dot = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), a_sums);
      acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(-y[i].d * h2f(b[r]->dmin)), _mm_cvtepi32_ps(mins_dot), acc_m[r]);
      scales[r] = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
      sumi[r] = _mm256_setzero_si256();
    }
    for (int j = 0; j < kQK_K / 64; ++j) {
      const __m256i q8l = load256(y[i].qs + 64 * j);
      const __m256i q8h = load256(y[i].qs + 64 * j + 32);
      const __m256i shuf_l = broadcast_i16_mask(2 * j), shuf_h = broadcast_i16_mask(2 * j + 1);
      for (int r = 0; r < R; ++r) {
        const __m256i bits = load256(b[r]->qs + 32 * j);
        __m256i q_even = _mm256_and_si256(bits, m4);  // sub-block 2j
        __m256i q_odd = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);  // 2j+1
        if constexpr (kFive) {  // fifth bit of sub-block s is bit s of qh[l]
          const __m256i hb = load256(b[r]->qh);
          const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), one);
          const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), one);
          q_even = _mm256_or_si256(q_even, _mm256_slli_epi16(h0, 4));
          q_odd = _mm256_or_si256(q_odd, _mm256_slli_epi16(h1, 4));
        }
        sumi[r] = madd_acc_i16(sumi[r], _mm256_shuffle_epi8(scales[r], shuf_l), pairs_us8_i16(q_even, q8l));
        sumi[r] = madd_acc_i16(sumi[r], _mm256_shuffle_epi8(scales[r], shuf_h), pairs_us8_i16(q_odd, q8h));
      }
    }
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(b[r]->d)), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_f32x8(acc[r]) + hsum_f32x4(acc_m[r]);
}

// pshufb mask for Q6_K: bytes 0..7 pick scale 2k, bytes 8..15 scale 2k+1 (the two
// 16-element sub-blocks of a 32-element run).
inline __m128i q6_scale_mask(int k) {
  return _mm_set_epi64x(static_cast<int64_t>(0x0101010101010101ull * (2 * k + 1)),
                        static_cast<int64_t>(0x0101010101010101ull * (2 * k)));
}

// Q6_K: d * sum_j sc_j * dot(q - 32, a), q in [0, 64). The -32 is applied once per
// super-block as -32 * sum_j sc_j * bsums_j, so the inner loop multiplies unsigned q.
template <int R>
void q6_k_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m256i bsums = load256(y[i].bsums);
    const BlockQ6_K* b[R];
    __m128i scales[R];
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) {
      b[r] = row_ptr<BlockQ6_K>(w, stride, r) + i;
      scales[r] = load128(b[r]->scales);
      const __m256i offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales[r]), bsums);
      sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
    }
    for (int j = 0; j < kQK_K / 128; ++j) {
      __m256i q8[4];
      for (int k = 0; k < 4; ++k) q8[k] = load256(y[i].qs + 128 * j + 32 * k);
      for (int r = 0; r < R; ++r) {
        const __m256i lo1 = load256(b[r]->ql + 64 * j), lo2 = load256(b[r]->ql + 64 * j + 32);
        const __m256i hb = load256(b[r]->qh + 32 * j);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(lo2, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
        for (int k = 0; k < 4; ++k) {
          const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales[r], q6_scale_mask(4 * j + k)));
          sumi[r] = madd_acc_i16(sumi[r], sc, pairs_us8_i16(q[k], q8[k]));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(b[r]->d)), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_f32x8(acc[r]);
}

// IQ4_XS: d * sum over 8 sub-blocks of (ls - 32) * dot(kvalues[q], a).
template <int R>
void iq4_xs_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const __m256i table = _mm256_broadcastsi128_si256(load128(kIq4nlValues));
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const __m256i q8 = load256(y[i].qs + 32 * ib);
      for (int r = 0; r < R; ++r) {
        const BlockIQ4_XS& b = row_ptr<BlockIQ4_XS>(w, stride, r)[i];
        const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((b.scales_h >> 2 * ib) & 3) << 4);
        const __m256i q = _mm256_shuffle_epi8(table, nibbles_32(b.qs + 16 * ib));
        const __m256i p = pairs_us8_i16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q));
        sumi[r] = madd_acc_i16(sumi[r], _mm256_set1_epi16(static_cast<short>(ls - 32)), p);
      }
    }
    for (int r = 0; r < R; ++r) {
      const float d = y[i].d * h2f(row_ptr<BlockIQ4_XS>(w, stride, r)[i].d);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_f32x8(acc[r]);
}

}  // namespace
}  // namespace frink::quant
