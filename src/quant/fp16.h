// Scalar conversions between f32 and the 16-bit and 8-bit float formats GGUF stores:
// IEEE half (scales of every legacy and K block, F16 tensors), bfloat16 (BF16 tensors) and
// E8M0 (MXFP4's shared exponent). Bit-exact with ggml: f32->f16 and f32->bf16 round to
// nearest even (what F16C's _mm_cvtps_ph with rounding mode 0 does), f16->f32 is exact.
// No tables: a 64K-entry lookup would need a global initialised at start-up, and the
// branch-free bit arithmetic below is as fast in the places it is used (one scale per block).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace frink {

inline float f16_to_f32(uint16_t h) {
  // Shift the half into the top of a float and rescale by 2^-112 (the exponent-bias
  // difference); subnormal halves go through the "magic number" subtraction instead.
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = std::bit_cast<float>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = two_w < (1u << 27) ? std::bit_cast<uint32_t>(denormalized)
                                           : std::bit_cast<uint32_t>(normalized);
  return std::bit_cast<float>(sign | bits);
}

inline uint16_t f32_to_f16(float f) {
  // Round to nearest even by letting the FPU do it: adding a power of two that puts the
  // half's last mantissa bit at the float's last bit makes the hardware round there.
  // Overflow goes to inf, NaN stays NaN (0x7E00), as in ggml_compute_fp32_to_fp16.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);  // nearest even
}

// MXFP4's scale byte e means 2^(e-127); ggml stores the E2M1 values DOUBLED (kvalues_mxfp4)
// and so multiplies by half the scale, 2^(e-128). e = 0 and 1 give float subnormals.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return std::bit_cast<float>(bits);
}

}  // namespace frink
