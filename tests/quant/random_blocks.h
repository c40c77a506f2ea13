// Test helpers: random but well-formed weight rows of every host type (random bytes with
// every float scale field overwritten by a finite, moderate value, so the whole code space
// of the quants is exercised, including codes no quantizer emits), and random activations.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/ggml_type.h"

namespace frink::test {

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint8_t> random_weight_row(std::mt19937& rng, GgmlType t, int64_t n) {
  using namespace quant;
  std::vector<uint8_t> bytes(ggml_row_bytes(t, n));
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    const auto x = random_floats(rng, n);
    for (int64_t i = 0; i < n; ++i) {
      if (t == GgmlType::F32) std::memcpy(bytes.data() + 4 * i, &x[i], 4);
      const uint16_t h = t == GgmlType::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
      if (t != GgmlType::F32) std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    return bytes;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  const auto h = [&] { return f32_to_f16(scale(rng)); };
  const int64_t nb = n / ggml_type_info(t).block_elems;
  for (int64_t i = 0; i < nb; ++i) {
    void* blk = bytes.data() + i * ggml_type_info(t).block_bytes;
    switch (t) {
      case GgmlType::Q4_0: static_cast<BlockQ4_0*>(blk)->d = h(); break;
      case GgmlType::Q4_1: static_cast<BlockQ4_1*>(blk)->d = h(); static_cast<BlockQ4_1*>(blk)->m = h(); break;
      case GgmlType::Q5_0: static_cast<BlockQ5_0*>(blk)->d = h(); break;
      case GgmlType::Q5_1: static_cast<BlockQ5_1*>(blk)->d = h(); static_cast<BlockQ5_1*>(blk)->m = h(); break;
      case GgmlType::Q8_0: static_cast<BlockQ8_0*>(blk)->d = h(); break;
      case GgmlType::Q2_K: static_cast<BlockQ2_K*>(blk)->d = h(); static_cast<BlockQ2_K*>(blk)->dmin = h(); break;
      case GgmlType::Q3_K: static_cast<BlockQ3_K*>(blk)->d = h(); break;
      case GgmlType::Q4_K: static_cast<BlockQ4_K*>(blk)->d = h(); static_cast<BlockQ4_K*>(blk)->dmin = h(); break;
      case GgmlType::Q5_K: static_cast<BlockQ5_K*>(blk)->d = h(); static_cast<BlockQ5_K*>(blk)->dmin = h(); break;
      case GgmlType::Q6_K: static_cast<BlockQ6_K*>(blk)->d = h(); break;
      case GgmlType::IQ4_NL: static_cast<BlockIQ4_NL*>(blk)->d = h(); break;
      case GgmlType::IQ4_XS: static_cast<BlockIQ4_XS*>(blk)->d = h(); break;
      case GgmlType::MXFP4: static_cast<BlockMXFP4*>(blk)->e = static_cast<uint8_t>(118 + byte(rng) % 16); break;
      default: break;
    }
  }
  return bytes;
}

// The weight types with host dot kernels, i.e. every row of the type table that is a weight.
inline const std::vector<GgmlType>& weight_types() {
  static const std::vector<GgmlType> kTypes = {
      GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,   GgmlType::Q4_1,   GgmlType::Q5_0,
      GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,   GgmlType::Q5_K,
      GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4};
  return kTypes;
}

}  // namespace frink::test
