// x86 dot kernels for the 32-element block types and the plain float types; included by
// dot_avx2.cpp and dot_avx512.cpp only (see dot_x86_common.h for why the bodies are shared
// this way). Every kernel is a template over R, the number of weight rows sharing one pass
// over the activation: each activation block is loaded (and, where it helps, summed) once
// and used for all R rows, which is what makes vec_dot_rows faster than R vec_dots.
// Integer parts are exact; only the float accumulation order differs from dot_scalar.cpp.
#pragma once

#include "quant/dot_x86_common.h"

namespace frink::quant {
namespace {

// ---- 32-element blocks against Q8_0 / Q8_1 ----

// How each legacy type turns its block into 32 int8 lanes, and whether they are unsigned.
struct Q4_0Decode {
  using Block = BlockQ4_0;
  static constexpr bool kUnsigned = true;  // q in [0, 16); the -8 comes from sum(a) below
  static constexpr int kOffset = 8;
  static __m256i q(const Block& b) { return nibbles_32(b.qs); }
  static float scale(const Block& b) { return h2f(b.d); }
};
struct Q8_0Decode {
  using Block = BlockQ8_0;
  static constexpr bool kUnsigned = false;
  static constexpr int kOffset = 0;
  static __m256i q(const Block& b) { return load256(b.qs); }
  static float scale(const Block& b) { return h2f(b.d); }
};
struct Q5_0Decode {
  using Block = BlockQ5_0;
  static constexpr bool kUnsigned = false;
  static constexpr int kOffset = 0;
  // nibble | 0xF0 where the fifth bit is clear reads, as int8, nibble + 16*bit - 16.
  static __m256i q(const Block& b) {
    const __m256i hi = _mm256_andnot_si256(bits_32(b.qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
    return _mm256_or_si256(nibbles_32(b.qs), hi);
  }
  static float scale(const Block& b) { return h2f(b.d); }
};
struct IQ4_NLDecode {
  using Block = BlockIQ4_NL;
  static constexpr bool kUnsigned = false;
  static constexpr int kOffset = 0;
  static __m256i q(const Block& b) {
    const __m256i table = _mm256_broadcastsi128_si256(load128(kIq4nlValues));
    return _mm256_shuffle_epi8(table, nibbles_32(b.qs));
  }
  static float scale(const Block& b) { return h2f(b.d); }
};
struct MXFP4Decode {
  using Block = BlockMXFP4;
  static constexpr bool kUnsigned = false;
  static constexpr int kOffset = 0;
  static __m256i q(const Block& b) {
    const __m256i table = _mm256_broadcastsi128_si256(load128(kMxfp4Values));
    return _mm256_shuffle_epi8(table, nibbles_32(b.qs));
  }
  static float scale(const Block& b) {  // 2^(e-128), as e8m0_to_f32_half in fp16.h
    const uint32_t bits = b.e < 2 ? (0x00200000u << b.e) : (static_cast<uint32_t>(b.e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
};

// sum over blocks of d_w * d_a * dot(q_w - offset, q_a), R rows at a time.
template <typename D, int R>
void q8_0_act_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  using Block = typename D::Block;
  const auto* y = static_cast<const BlockQ8_0*>(act);
  const Block* x[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) {
    x[r] = row_ptr<Block>(w, stride, r);
    acc[r] = _mm256_setzero_ps();
  }
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    const __m256i qy = load256(y[ib].qs);
    const float dy = h2f(y[ib].d);
    // dot(q - k, a) = dot(q, a) - k * sum(a); sum(a) is computed once for all R rows.
    __m256i offset_sum = _mm256_setzero_si256();
    if constexpr (D::kOffset != 0)
      offset_sum = _mm256_mullo_epi32(dot_us8_i32(_mm256_set1_epi8(1), qy), _mm256_set1_epi32(D::kOffset));
    for (int r = 0; r < R; ++r) {
      const __m256i qx = D::q(x[r][ib]);
      __m256i p = D::kUnsigned ? dot_us8_i32(qx, qy) : dot_s8_i32(qx, qy);
      if constexpr (D::kOffset != 0) p = _mm256_sub_epi32(p, offset_sum);
      const __m256 d = _mm256_set1_ps(D::scale(x[r][ib]) * dy);
      acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_f32x8(acc[r]);
}

// Q4_1 / Q5_1 against Q8_1: d_w d_a dot(q_w, q_a) + m_w * s_a, s_a = d_a * sum(q_a).
template <bool kFive, int R>
void q8_1_act_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const BlockQ8_1*>(act);
  __m256 acc[R];
  float summs[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    summs[r] = 0;
  }
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    const __m256i qy = load256(y[ib].qs);
    const float dy = h2f(y[ib].d), sy = h2f(y[ib].s);
    for (int r = 0; r < R; ++r) {
      __m256i qx;
      float dx, mx;
      if constexpr (kFive) {
        const BlockQ5_1& b = row_ptr<BlockQ5_1>(w, stride, r)[ib];
        qx = _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bits_32(b.qh), _mm256_set1_epi8(0x10)));
        dx = h2f(b.d);
        mx = h2f(b.m);
      } else {
        const BlockQ4_1& b = row_ptr<BlockQ4_1>(w, stride, r)[ib];
        qx = nibbles_32(b.qs);
        dx = h2f(b.d);
        mx = h2f(b.m);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(dot_us8_i32(qx, qy)), acc[r]);
      summs[r] += mx * sy;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_f32x8(acc[r]) + summs[r];
}

// ---- plain float types ----

struct F32Load {
  using T = float;
  static __m256 load(const T* p) { return _mm256_loadu_ps(p); }
  static float one(T v) { return v; }
};
struct F16Load {
  using T = uint16_t;
  static __m256 load(const T* p) { return _mm256_cvtph_ps(load128(p)); }
  static float one(T v) { return h2f(v); }
};
struct BF16Load {
  using T = uint16_t;
  static __m256 load(const T* p) {  // bf16 is the top half of an f32
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
  }
  static float one(T v) {
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
};

// Two accumulators per row over 16 elements a step hide the FMA latency; the tail that is
// not a multiple of 8 runs in scalar.
template <typename L, int R>
void float_kernel(const void* w, size_t stride, const void* act, int64_t n, float* out) {
  using T = typename L::T;
  const auto* y = static_cast<const T*>(act);
  const T* x[R];
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    x[r] = row_ptr<T>(w, stride, r);
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 y0 = L::load(y + i), y1 = L::load(y + i + 8);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm256_fmadd_ps(L::load(x[r] + i), y0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(L::load(x[r] + i + 8), y1, acc1[r]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 y0 = L::load(y + i);
    for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(L::load(x[r] + i), y0, acc0[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum_f32x8(_mm256_add_ps(acc0[r], acc1[r]));
    for (int64_t k = i; k < n; ++k) s += L::one(x[r][k]) * L::one(y[k]);
    out[r] = s;
  }
}

}  // namespace
}  // namespace frink::quant
