// Scalar reference dot products for the plain and 32-element block types, in the shape of
// ggml-cpu's *_generic kernels: integer dot per block, then one float multiply-add by the
// product of the two block scales. They are the yardstick the SIMD kernels are tested
// against, so they favour clarity (and, for F16/BF16/F32, double accumulation as in
// ggml_vec_dot_f16's generic path) over speed.
#include <cstring>

#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/fp16.h"

namespace frink::quant {

float dot_f32_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

float dot_f16_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(f16_to_f32(x[i]) * f16_to_f32(y[i]));
  return static_cast<float>(sum);
}

float dot_bf16_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_f32(x[i]) * bf16_to_f32(y[i]));
  return static_cast<float>(sum);
}

float dot_q4_0_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + kQK / 2];
    }
    sum += sumi * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
  }
  return sum;
}

float dot_q4_1_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + kQK / 2];
    }
    // sum_j (d q_j + m) dy qy_j = d dy sumi + m * (dy sum qy) and y.s holds dy * sum qy.
    sum += (f16_to_f32(x[i].d) * f16_to_f32(y[i].d)) * sumi + f16_to_f32(x[i].m) * f16_to_f32(y[i].s);
  }
  return sum;
}

float dot_q5_0_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      sumi += (((x[i].qs[j] & 0x0F) | h0) - 16) * y[i].qs[j];
      sumi += (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + kQK / 2];
    }
    sum += sumi * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
  }
  return sum;
}

float dot_q5_1_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      sumi += ((x[i].qs[j] & 0x0F) | h0) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + kQK / 2];
    }
    sum += (f16_to_f32(x[i].d) * f16_to_f32(y[i].d)) * sumi + f16_to_f32(x[i].m) * f16_to_f32(y[i].s);
  }
  return sum;
}

float dot_q8_0_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += sumi * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
  }
  return sum;
}

float dot_iq4_nl_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += kIq4nlValues[x[i].qs[j] & 0xF] * y[i].qs[j];
      sumi += kIq4nlValues[x[i].qs[j] >> 4] * y[i].qs[j + kQK / 2];
    }
    sum += (f16_to_f32(x[i].d) * f16_to_f32(y[i].d)) * sumi;
  }
  return sum;
}

float dot_mxfp4_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += kMxfp4Values[x[i].qs[j] & 0xF] * y[i].qs[j];
      sumi += kMxfp4Values[x[i].qs[j] >> 4] * y[i].qs[j + kQK / 2];
    }
    sum += (f16_to_f32(y[i].d) * e8m0_to_f32_half(x[i].e)) * sumi;
  }
  return sum;
}

}  // namespace frink::quant
