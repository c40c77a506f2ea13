// Internal to src/quant: the SIMD kernel sets, one per instruction-set level, each built
// in its own translation unit with its own -m flags (dot_avx2.cpp, dot_avx512.cpp).
// dispatch.cpp asks the CPU once which set may run and takes kernels from it; a type a
// set does not cover keeps the scalar reference.
#pragma once

#include "quant/dequant.h"
#include "quant/ggml_type.h"

namespace frink::quant {

struct SimdDot {
  DotFn dot = nullptr;       // null: this level has no kernel for the type
  DotRowsFn rows = nullptr;  // null: rows are done one dot at a time
  DotTileFn tile = nullptr;  // null: tokens are done one vec_dot_rows at a time
};

SimdDot avx2_dot_kernel(GgmlType weight);    // needs AVX2, FMA, F16C
SimdDot avx512_dot_kernel(GgmlType weight);  // needs AVX-512 F/BW/VL/DQ/VNNI as well

}  // namespace frink::quant
