// The kernel table of one x86 instruction-set level: maps a weight type to its R-row
// kernels. Included once by dot_avx2.cpp and once by dot_avx512.cpp, each defining
// FRINK_X86_TABLE_FN to the function name it exports.
#pragma once

#include "quant/dot_x86_k.h"
#include "quant/dot_x86_legacy.h"
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
  return SimdDot{&dot_one<K<1>::run>, &dot_rows<K<4>::run, K<1>::run>};
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
template <int R> struct Q6K { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { q6_k_kernel<R>(w, s, a, n, o); } };
template <int R> struct IQ4XS { static void run(const void* w, size_t s, const void* a, int64_t n, float* o) { iq4_xs_kernel<R>(w, s, a, n, o); } };

}  // namespace

SimdDot FRINK_X86_TABLE_FN(GgmlType weight) {
  switch (weight) {
    case GgmlType::F32: return entry<Float<F32Load>::K>();
    case GgmlType::F16: return entry<Float<F16Load>::K>();
    case GgmlType::BF16: return entry<Float<BF16Load>::K>();
    case GgmlType::Q4_0: return entry<Q8_0Act<Q4_0Decode>::K>();
    case GgmlType::Q5_0: return entry<Q8_0Act<Q5_0Decode>::K>();
    case GgmlType::Q8_0: return entry<Q8_0Act<Q8_0Decode>::K>();
    case GgmlType::IQ4_NL: return entry<Q8_0Act<IQ4_NLDecode>::K>();
    case GgmlType::MXFP4: return entry<Q8_0Act<MXFP4Decode>::K>();
    case GgmlType::Q4_1: return entry<Q8_1Act<false>::K>();
    case GgmlType::Q5_1: return entry<Q8_1Act<true>::K>();
    case GgmlType::Q4_K: return entry<K4<false>::K>();
    case GgmlType::Q5_K: return entry<K4<true>::K>();
    case GgmlType::Q6_K: return entry<Q6K>();
    case GgmlType::IQ4_XS: return entry<IQ4XS>();
    default: return {};  // Q2_K, Q3_K: the scalar reference runs
  }
}

}  // namespace frink::quant
