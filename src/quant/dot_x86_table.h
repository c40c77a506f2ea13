// The kernel table of one x86 instruction-set level: maps a weight type to its R-row
// kernels and its RM x RN tile kernel (dot_x86_tile.h). Included once by dot_avx2.cpp and once by dot_avx512.cpp, each defining
// FRINK_X86_TABLE_FN to the function name it exports.
#pragma once

#include "quant/dot_x86_k.h"
#include "quant/dot_x86_legacy.h"
#include "quant/dot_x86_tile.h"
#include "quant/simd_kernels.h"

namespace frink::quant {
namespace {

using KernelR = void (*)(const void* w, size_t stride, const void* act, int64_t n, float* out);

template <KernelR K1>
float dot_one(const void* w, const void* act, int64_t n) {
  float out;
  K1(w, 0, act, n, &out);
  return out;
}

// Rows in groups of kRows (one activation pass per group), the remainder one at a time.
// Four rows: the activation block plus four rows' accumulators and scales fit the 16 ymm
// registers of AVX2 for the legacy types and nearly for the K-quants.
template <KernelR K4, KernelR K1>
void dot_rows(const void* w, size_t stride, int64_t n_rows, const void* act, int64_t n, float* out) {
  constexpr int kRows = 4;
  const auto* base = static_cast<const char*>(w);
  int64_t r = 0;
  for (; r + kRows <= n_rows; r += kRows) K4(base + r * stride, stride, act, n, out + r);
  for (; r < n_rows; ++r) K1(base + r * stride, stride, act, n, out + r);
}

template <template <int> class K>
SimdDot entry() {
  return SimdDot{&dot_one<K<1>::run>, &dot_rows<K<4>::run, K<1>::run>, nullptr};
}

// One row group (RM rows) against every token, RN tokens at a time, the leftover tokens
// one at a time. The RM rows (a few KB) stay in L1 while the activations stream past.
template <template <int, int> class T, int RM, int RN>
void tile_row_group(const void* w, size_t w_stride, const char* act, size_t act_stride, int64_t n_tok, int64_t n,
                    float* out, size_t out_stride) {
  int64_t t = 0;
  for (; t + RN <= n_tok; t += RN)
    T<RM, RN>::run(w, w_stride, act + t * act_stride, act_stride, n, out + t * out_stride, out_stride);
  for (; t < n_tok; ++t) T<RM, 1>::run(w, w_stride, act + t * act_stride, act_stride, n, out + t * out_stride, out_stride);
}

// The DotTileFn of a family: row groups of RM, leftover rows one at a time.
template <template <int, int> class T, int RM, int RN>
void dot_tile(const void* w, size_t w_stride, int64_t n_rows, const void* act, size_t act_stride, int64_t n_tok,
              int64_t n, float* out, size_t out_stride) {
  const auto* wb = static_cast<const char*>(w);
  const auto* ab = static_cast<const char*>(act);
  int64_t r = 0;
  for (; r + RM <= n_rows; r += RM)
    tile_row_group<T, RM, RN>(wb + r * w_stride, w_stride, ab, act_stride, n_tok, n, out + r, out_stride);
  for (; r < n_rows; ++r)
    tile_row_group<T, 1, RN>(wb + r * w_stride, w_stride, ab, act_stride, n_tok, n, out + r, out_stride);
}

// A family's one-row kernels plus its tile. Tile shapes keep the RM*RN accumulators and
// the RM decoded weight blocks in registers: 32 ymm with AVX-512VL, 16 with AVX2
// (bench_quant_dot vec_dot_tile/* chose among 2x2, 2x4, 4x4).
template <template <int> class K, template <int, int> class T, int RM, int RN>
SimdDot entry_tiled() {
  SimdDot d = entry<K>();
  d.tile = &dot_tile<T, RM, RN>;
  return d;
}

// Adapters giving every kernel family the same template<int R> shape.
template <typename D> struct Q8_0Act {
  template <int R> struct K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { q8_0_act_kernel<D, R>(w, s, a, n, o); } };
};
template <bool kFive> struct Q8_1Act {
  template <int R> struct K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { q8_1_act_kernel<kFive, R>(w, s, a, n, o); } };
};
template <typename L> struct Float {
  template <int R> struct K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { float_kernel<L, R>(w, s, a, n, o); } };
};
template <bool kFive> struct K4 {
  template <int R> struct K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { k4_kernel<kFive, R>(w, s, a, n, o); } };
};
template <typename D> struct Q8_0Tile {
  template <int RM, int RN> struct T { static void run(const void* w, size_t ws, const void* a, size_t as, int64_t n, float* o, size_t os) { q8_0_act_tile<D, RM, RN>(w, ws, a, as, n, o, os); } };
};
template <typename L> struct FloatTile {
  template <int RM, int RN> struct T { static void run(const void* w, size_t ws, const void* a, size_t as, int64_t n, float* o, size_t os) { float_tile<L, RM, RN>(w, ws, a, as, n, o, os); } };
};
template <bool kFive> struct K4Tile {
  template <int RM, int RN> struct T { static void run(const void* w, size_t ws, const void* a, size_t as, int64_t n, float* o, size_t os) { k4_tile<kFive, RM, RN>(w, ws, a, as, n, o, os); } };
};
template <int RM, int RN> struct Q6KTile { static void run(const void* w, size_t ws, const void* a, size_t as, int64_t n, float* o, size_t os) { q6_k_tile<RM, RN>(w, ws, a, as, n, o, os); } };
template <int R> struct Q6K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { q6_k_kernel<R>(w, s, a, n, o); } };
template <int R> struct IQ4XS { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { iq4_xs_kernel<R>(w, s, a, n, o); } };

}  // namespace

SimdDot FRINK_X86_TABLE_FN(GgmlType weight) {
  constexpr int kQ0M = kWideRegs ? 4 : 2, kQ0N = 4;  // Q8_0-activation tile
  constexpr int kFM = 2, kFN = kWideRegs ? 4 : 2;     // float tile
  constexpr int kK4M = 2, kK4N = kWideRegs ? 4 : 2;   // Q4_K / Q5_K tile
  constexpr int kQ6M = kWideRegs ? 4 : 2, kQ6N = 4;   // Q6_K tile
  switch (weight) {
    case GgmlType::F32: return entry_tiled<Float<F32Load>::K, FloatTile<F32Load>::T, kFM, kFN>();
    case GgmlType::F16: return entry_tiled<Float<F16Load>::K, FloatTile<F16Load>::T, kFM, kFN>();
    case GgmlType::BF16: return entry_tiled<Float<BF16Load>::K, FloatTile<BF16Load>::T, kFM, kFN>();
    case GgmlType::Q4_0: return entry_tiled<Q8_0Act<Q4_0Decode>::K, Q8_0Tile<Q4_0Decode>::T, kQ0M, kQ0N>();
    case GgmlType::Q5_0: return entry_tiled<Q8_0Act<Q5_0Decode>::K, Q8_0Tile<Q5_0Decode>::T, kQ0M, kQ0N>();
    case GgmlType::Q8_0: return entry_tiled<Q8_0Act<Q8_0Decode>::K, Q8_0Tile<Q8_0Decode>::T, kQ0M, kQ0N>();
    case GgmlType::IQ4_NL: return entry_tiled<Q8_0Act<IQ4_NLDecode>::K, Q8_0Tile<IQ4_NLDecode>::T, kQ0M, kQ0N>();
    case GgmlType::MXFP4: return entry_tiled<Q8_0Act<MXFP4Decode>::K, Q8_0Tile<MXFP4Decode>::T, kQ0M, kQ0N>();
    case GgmlType::Q4_1: return entry<Q8_1Act<false>::K>();
    case GgmlType::Q5_1: return entry<Q8_1Act<true>::K>();
    case GgmlType::Q4_K: return entry_tiled<K4<false>::K, K4Tile<false>::T, kK4M, kK4N>();
    case GgmlType::Q5_K: return entry_tiled<K4<true>::K, K4Tile<true>::T, kK4M, kK4N>();
    case GgmlType::Q6_K: return entry_tiled<Q6K, Q6KTile, kQ6M, kQ6N>();
    case GgmlType::IQ4_XS: return entry<IQ4XS>();
    default: return {};  // Q2_K, Q3_K: the scalar reference runs
  }
}

}  // namespace frink::quant
