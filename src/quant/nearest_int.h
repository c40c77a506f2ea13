// ggml's nearest_int: round to nearest, ties to even, by adding 1.5 * 2^23 so the FPU's
// rounding drops the fraction, then reading the integer back out of the mantissa. Valid for
// |x| <= 2^22 (asserted in ggml; every caller here scales into a few hundred at most).
// Kept separate from std::nearbyint on purpose: the quantizers must reproduce ggml's bits,
// and this does not depend on the current rounding mode being set to nearest.
#pragma once

#include <bit>
#include <cstdint>

namespace frink::quant {

inline int nearest_int(float x) {
  const float v = x + 12582912.f;
  return static_cast<int>(std::bit_cast<int32_t>(v) & 0x007FFFFF) - 0x00400000;
}

}  // namespace frink::quant
