// x86 multi-token tile kernels: an RM x RN block of dot products (RM weight rows times RN
// activation rows) in one pass, so each weight block is decoded ONCE into registers and
// multiplied with RN tokens' activations, and each activation block is loaded once for RM
// rows (llamafile's tinyBLAS idea). Included by dot_avx2.cpp and dot_avx512.cpp only (see
// dot_x86_common.h for why the bodies are shared this way).
//
// Invariant: every (row, token) result is BIT-IDENTICAL to the one-row kernels of
// dot_x86_legacy.h / dot_x86_k.h: the same exact integer lanes, the same float scale
// products, the same per-block fmadd into one 8-lane accumulator and the same horizontal
// sum. A token's logits therefore do not depend on its tile-mates or on the batch split
// (tests/engine kv_truncate_test.cpp checks that end to end; dot_tile_test.cpp per kernel).
// Integer lanes may be computed differently (VNNI's offset-carrying accumulator below):
// integer sums are exact, so the lanes are the same numbers.
//
// Notebook (bench_quant_dot vec_dot_tile/*: 2048x2048 x 64 tokens, 1 thread, GFLOP/s per
// CPU second; 2-core AMD EPYC with AVX-512 VNNI, shared machine, load ~5.5):
//   v1 "rows" (vec_dot_rows once per token, the old matmul): Q4_0 55, Q8_0 65, Q4_K 67,
//      Q5_K 54, Q6_K 52, F16 52.
//   v2 these tiles (AVX-512: 4x4 Q8_0-act and Q6_K, 2x4 Q4_K/Q5_K and float): Q4_0 95,
//      Q8_0 102, Q4_K 112, Q5_K 103, Q6_K 114, F16 80. AVX2 tiles (2x4 / 2x2): Q4_0 63,
//      Q8_0 68, Q4_K 53 (slower than the AVX-512 rows kernel; not tuned), Q6_K 96.
//   Where v2 stops: no spills in the 4x4 Q4_0 loop (perf annotate), ~1.8 cycles per
//   (row, token, block) for mov + vpdpbusd + cvt + mulss + broadcast + fma. The per-pair
//   scale product and 8-lane float accumulator are what bit-identity with vec_dot costs;
//   llama.cpp's repacked 8-row layouts reduce the int lanes across rows first and pay the
//   float work once per 8 rows, at the price of a different summation order.
//   v3 (tried, dropped): the RM scale products of a block as ONE 4-lane mulps per token,
//      stored to the stack and read by the fma as an embedded broadcast ({1to8}). Slower:
//      Q4_0 86 vs 92, Q8_0 91 vs 94 (AVX-512), Q4_0 36 vs 64 (AVX2), three interleaved
//      A/B runs at load ~3.4; the store-to-broadcast-load round trip costs more than the
//      mulss + vbroadcastss it saves.
//   Q4_K/Q5_K tile shape (AVX-512), three interleaved runs: 2x4 Q4_K 114 / Q5_K 101,
//      2x8 107-112 / 102-103, 3x4 112-114 / 97-98; 2x4 kept.
#pragma once

#include <type_traits>

#include "quant/dot_x86_k.h"
#include "quant/dot_x86_legacy.h"

namespace frink::quant {
namespace {

#if defined(__AVX512VL__)
inline constexpr bool kWideRegs = true;  // 32 ymm registers
#else
inline constexpr bool kWideRegs = false;  // 16 ymm registers
#endif

template <typename T>
inline const T* tok_ptr(const void* act, size_t stride, int t) {
  return reinterpret_cast<const T*>(static_cast<const char*>(act) + static_cast<size_t>(t) * stride);
}

// acc + the 8 int32 lane sums of u[k] * s[k] (u unsigned, s signed bytes). With VNNI the
// accumulator rides in vpdpbusd for free; callers keep maddubs' int16 bound without VNNI.
inline __m256i dot_us8_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, dot_us8_i32(u, s));
#endif
}

// ---- 32-element blocks against Q8_0 ----
//
// Per (row, token, block) the one-row kernel computes the int32 lanes p = dot(q_w - k, q_a)
// (4 bytes per lane) and acc = fma(d_w * d_a, float(p), acc). Here:
//  - unsigned weights (Q4_0): p = dpbusd(-k * sum(q_a), q_w, q_a), the offset term made
//    once per token and block;
//  - signed weights with VNNI: dpbusd needs one unsigned operand, so the activation is
//    shifted to q_a + 128 (once per token and block) and the surplus 128 * sum(q_w) is the
//    starting value (once per row and block): p = dpbusd(-128 * sum(q_w), q_a ^ 0x80, q_w).
//    (q_a + 128 <= 255 would saturate maddubs, hence VNNI only.)
//  - signed weights without VNNI: dot_s8_i32 as in the one-row kernel.
template <typename D, int RM, int RN>
void q8_0_act_tile(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, float* out,
                   size_t out_stride) {
  using Block = typename D::Block;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  constexpr bool kShiftAct = !D::kUnsigned;
#else
  constexpr bool kShiftAct = false;
#endif
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m256i qx[RM], base_r[RM];
    __m256 dx[RM];
    for (int r = 0; r < RM; ++r) {
      const Block& b = row_ptr<Block>(w, w_stride, r)[ib];
      qx[r] = D::q(b);
      dx[r] = _mm256_set1_ps(D::scale(b));
      if constexpr (kShiftAct)
        base_r[r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_slli_epi32(dot_us8_i32(_mm256_set1_epi8(1), qx[r]), 7));
      else if constexpr (!D::kUnsigned)
        base_r[r] = _mm256_sign_epi8(qx[r], qx[r]);  // |q_w| for dot_s8_i32's sign trick
    }
    for (int t = 0; t < RN; ++t) {
      const BlockQ8_0& y = tok_ptr<BlockQ8_0>(act, act_stride, t)[ib];
      __m256i qy = load256(y.qs);
      const __m256 dy = _mm256_set1_ps(h2f(y.d));
      __m256i base_t = _mm256_setzero_si256();
      if constexpr (D::kOffset != 0)
        base_t = _mm256_sub_epi32(base_t, _mm256_mullo_epi32(dot_us8_i32(_mm256_set1_epi8(1), qy),
                                                             _mm256_set1_epi32(D::kOffset)));
      if constexpr (kShiftAct) qy = _mm256_xor_si256(qy, _mm256_set1_epi8(static_cast<char>(0x80)));
      for (int r = 0; r < RM; ++r) {
        __m256i p;
        if constexpr (D::kUnsigned) p = dot_us8_acc(base_t, qx[r], qy);
        else if constexpr (kShiftAct) p = dot_us8_acc(base_r[r], qy, qx[r]);
        else p = dot_us8_i32(base_r[r], _mm256_sign_epi8(qy, qx[r]));
        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy), _mm256_cvtepi32_ps(p), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) out[t * out_stride + r] = hsum_f32x8(acc[r][t]);
}

// ---- Q4_K / Q5_K against Q8_K (the arithmetic of k4_kernel, per row and token) ----
template <bool kFive, int RM, int RN>
void k4_tile(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, float* out,
             size_t out_stride) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc[RM][RN];
  __m128 acc_m[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      acc_m[r][t] = _mm_setzero_ps();
    }
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const Block* b[RM];
    const BlockQ8_K* y[RN];
    __m256i scales[RM], sumi[RM][RN];
    __m128i a_sums[RN];  // sums of 32 activations, one per sub-block, for the mins term
    for (int t = 0; t < RN; ++t) {
      y[t] = tok_ptr<BlockQ8_K>(act, act_stride, t) + i;
      const __m256i bsums = load256(y[t]->bsums);
      a_sums[t] = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    }
    for (int r = 0; r < RM; ++r) {
      b[r] = row_ptr<Block>(w, w_stride, r) + i;
      const __m256i sm = k4_scales_mins(b[r]->scales);
      const __m128i mins = _mm256_extracti128_si256(sm, 1);
      const float dmin = h2f(b[r]->dmin);
      for (int t = 0; t < RN; ++t) {
        acc_m[r][t] = _mm_fmadd_ps(_mm_set1_ps(-y[t]->d * dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, a_sums[t])),
                                   acc_m[r][t]);
        sumi[r][t] = _mm256_setzero_si256();
      }
      scales[r] = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    }
    for (int j = 0; j < kQK_K / 64; ++j) {
      const __m256i shuf_l = broadcast_i16_mask(2 * j), shuf_h = broadcast_i16_mask(2 * j + 1);
      __m256i q_even[RM], q_odd[RM], sc_l[RM], sc_h[RM];
      for (int r = 0; r < RM; ++r) {
        const __m256i bits = load256(b[r]->qs + 32 * j);
        q_even[r] = _mm256_and_si256(bits, m4);
        q_odd[r] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if constexpr (kFive) {
          const __m256i hb = load256(b[r]->qh);
          const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), one);
          const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), one);
          q_even[r] = _mm256_or_si256(q_even[r], _mm256_slli_epi16(h0, 4));
          q_odd[r] = _mm256_or_si256(q_odd[r], _mm256_slli_epi16(h1, 4));
        }
        sc_l[r] = _mm256_shuffle_epi8(scales[r], shuf_l);
        sc_h[r] = _mm256_shuffle_epi8(scales[r], shuf_h);
      }
      for (int t = 0; t < RN; ++t) {
        const __m256i q8l = load256(y[t]->qs + 64 * j);
        const __m256i q8h = load256(y[t]->qs + 64 * j + 32);
        for (int r = 0; r < RM; ++r) {
          sumi[r][t] = madd_acc_i16(sumi[r][t], sc_l[r], pairs_us8_i16(q_even[r], q8l));
          sumi[r][t] = madd_acc_i16(sumi[r][t], sc_h[r], pairs_us8_i16(q_odd[r], q8h));
        }
      }
    }
    for (int r = 0; r < RM; ++r) {
      const float dw = h2f(b[r]->d);
      for (int t = 0; t < RN; ++t)
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t]->d * dw), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) out[t * out_stride + r] = hsum_f32x8(acc[r][t]) + hsum_f32x4(acc_m[r][t]);
}

// ---- Q6_K against Q8_K (the arithmetic of q6_k_kernel, per row and token) ----
template <int RM, int RN>
void q6_k_tile(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, float* out,
               size_t out_stride) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const BlockQ6_K* b[RM];
    const BlockQ8_K* y[RN];
    __m128i scales[RM];
    __m256i sumi[RM][RN];
    for (int t = 0; t < RN; ++t) y[t] = tok_ptr<BlockQ8_K>(act, act_stride, t) + i;
    for (int r = 0; r < RM; ++r) {
      b[r] = row_ptr<BlockQ6_K>(w, w_stride, r) + i;
      scales[r] = load128(b[r]->scales);
      const __m256i sc16 = _mm256_cvtepi8_epi16(scales[r]);
      for (int t = 0; t < RN; ++t) {
        const __m256i offset = _mm256_madd_epi16(sc16, load256(y[t]->bsums));
        sumi[r][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
      }
    }
    for (int j = 0; j < kQK_K / 128; ++j) {
      for (int k = 0; k < 4; ++k) {
        __m256i q[RM], sc[RM];
        for (int r = 0; r < RM; ++r) {
          // Element group k of the 128: low nibbles of ql[64j + 32(k%2) ..] when k < 2, high
          // nibbles when k >= 2; the two high bits are bits 2k, 2k+1 of qh[32j ..].
          const __m256i lo = load256(b[r]->ql + 64 * j + 32 * (k % 2));
          const __m256i hb = load256(b[r]->qh + 32 * j);
          const __m256i l4 = k < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
          const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), m2);
          q[r] = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
          sc[r] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales[r], q6_scale_mask(4 * j + k)));
        }
        for (int t = 0; t < RN; ++t) {
          const __m256i q8 = load256(y[t]->qs + 128 * j + 32 * k);
          for (int r = 0; r < RM; ++r) sumi[r][t] = madd_acc_i16(sumi[r][t], sc[r], pairs_us8_i16(q[r], q8));
        }
      }
    }
    for (int r = 0; r < RM; ++r) {
      const float dw = h2f(b[r]->d);
      for (int t = 0; t < RN; ++t)
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t]->d * dw), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) out[t * out_stride + r] = hsum_f32x8(acc[r][t]);
}

// ---- plain float types (the arithmetic of float_kernel, per row and token) ----
template <typename L, int RM, int RN>
void float_tile(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, float* out,
                size_t out_stride) {
  using T = typename L::T;
  const T* x[RM];
  const T* y[RN];
  __m256 acc0[RM][RN], acc1[RM][RN];
  for (int r = 0; r < RM; ++r) x[r] = row_ptr<T>(w, w_stride, r);
  for (int t = 0; t < RN; ++t) y[t] = tok_ptr<T>(act, act_stride, t);
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc0[r][t] = acc1[r][t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x0[RM], x1[RM];
    for (int r = 0; r < RM; ++r) {
      x0[r] = L::load(x[r] + i);
      x1[r] = L::load(x[r] + i + 8);
    }
    for (int t = 0; t < RN; ++t) {
      const __m256 y0 = L::load(y[t] + i), y1 = L::load(y[t] + i + 8);
      for (int r = 0; r < RM; ++r) {
        acc0[r][t] = _mm256_fmadd_ps(x0[r], y0, acc0[r][t]);
        acc1[r][t] = _mm256_fmadd_ps(x1[r], y1, acc1[r][t]);
      }
    }
  }
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < RN; ++t)
      for (int r = 0; r < RM; ++r)
        acc0[r][t] = _mm256_fmadd_ps(L::load(x[r] + i), L::load(y[t] + i), acc0[r][t]);
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) {
      float s = hsum_f32x8(_mm256_add_ps(acc0[r][t], acc1[r][t]));
      for (int64_t k = i; k < n; ++k) s += L::one(x[r][k]) * L::one(y[t][k]);
      out[t * out_stride + r] = s;
    }
}

}  // namespace
}  // namespace frink::quant
