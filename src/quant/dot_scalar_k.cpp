// Scalar reference dot products for the 256-element super-block types against Q8_K, in
// the shape of ggml-cpu's *_generic kernels: integer dots per sub-block weighted by the
// integer sub-block scales, one float multiply by d_w * d_a per super-block, and the
// K-quant "min" term computed from Q8_K's precomputed 16-element sums (bsums) instead of
// touching the activations again.
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/fp16.h"

namespace frink::quant {

namespace {

// sum over 16 elements of w[l] * a[l].
inline int dot16(const int8_t* w, const int8_t* a) {
  int s = 0;
  for (int l = 0; l < 16; ++l) s += w[l] * a[l];
  return s;
}

}  // namespace

float dot_q2_k_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int8_t q[kQK_K];
    // Unpack into element order (as dequant_q2_k walks it).
    int8_t* p = q;
    for (int half = 0; half < 2; ++half)
      for (int shift = 0; shift < 8; shift += 2)
        for (int l = 0; l < 32; ++l) *p++ = static_cast<int8_t>((x[i].qs[32 * half + l] >> shift) & 3);
    int sumi = 0, summ = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (x[i].scales[j] & 0xF) * dot16(q + 16 * j, y[i].qs + 16 * j);
      summ += (x[i].scales[j] >> 4) * y[i].bsums[j];
    }
    const float d = y[i].d * f16_to_f32(x[i].d);
    const float dmin = y[i].d * f16_to_f32(x[i].dmin);
    sum += d * sumi - dmin * summ;
  }
  return sum;
}

float dot_q3_k_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int8_t q[kQK_K];
    int8_t* p = q;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half)
      for (int shift = 0; shift < 8; shift += 2, m <<= 1)
        for (int l = 0; l < 32; ++l)
          *p++ = static_cast<int8_t>(((x[i].qs[32 * half + l] >> shift) & 3) - ((x[i].hmask[l] & m) ? 0 : 4));
    int8_t scales[16];
    unpack_q3_k_scales(x[i].scales, scales);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += (scales[j] - 32) * dot16(q + 16 * j, y[i].qs + 16 * j);
    sum += (f16_to_f32(x[i].d) * y[i].d) * sumi;
  }
  return sum;
}

float dot_q4_k_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      get_scale_min_k4(j, x[i].scales, &sc, &m);
      const uint8_t* qs = x[i].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      const int8_t* a = y[i].qs + 32 * j;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += ((qs[l] >> shift) & 0xF) * a[l];
      sumi += sc * s;
      summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = y[i].d * f16_to_f32(x[i].d);
    const float dmin = y[i].d * f16_to_f32(x[i].dmin);
    sum += d * sumi - dmin * summ;
  }
  return sum;
}

float dot_q5_k_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      get_scale_min_k4(j, x[i].scales, &sc, &m);
      const uint8_t* qs = x[i].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      const int8_t* a = y[i].qs + 32 * j;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += (((qs[l] >> shift) & 0xF) + (((x[i].qh[l] >> j) & 1) << 4)) * a[l];
      sumi += sc * s;
      summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const float d = y[i].d * f16_to_f32(x[i].d);
    const float dmin = y[i].d * f16_to_f32(x[i].dmin);
    sum += d * sumi - dmin * summ;
  }
  return sum;
}

float dot_q6_k_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int8_t q[kQK_K];
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32) {
      int8_t* p = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        p[l + 0] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        p[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        p[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        p[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += x[i].scales[j] * dot16(q + 16 * j, y[i].qs + 16 * j);
    sum += (f16_to_f32(x[i].d) * y[i].d) * sumi;
  }
  return sum;
}

float dot_iq4_xs_scalar(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sumi = 0;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
      const uint8_t* qs = x[i].qs + 16 * ib;
      const int8_t* a = y[i].qs + 32 * ib;
      int s = 0;
      for (int j = 0; j < 16; ++j) s += kIq4nlValues[qs[j] & 0xF] * a[j] + kIq4nlValues[qs[j] >> 4] * a[j + 16];
      sumi += (ls - 32) * s;
    }
    sum += (f16_to_f32(x[i].d) * y[i].d) * sumi;
  }
  return sum;
}

}  // namespace frink::quant
