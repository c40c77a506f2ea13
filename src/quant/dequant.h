// Internal to src/quant: the per-type decoders, quantizers and scalar dot kernels the
// type table (dispatch.cpp) points at. Callers outside the folder use quant.h.
// Every function takes n elements, a whole number of the type's blocks (checked by the
// caller in dispatch.cpp, once, not per kernel).
#pragma once

#include <cstddef>
#include <cstdint>

namespace frink::quant {

using DequantFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
// sum_i w[i] * a[i]; `act` is in the weight type's vec_dot_type.
using DotFn = float (*)(const void* w, const void* act, int64_t n);
// out[r] = dot(w + r * w_stride, act) for r in [0, n_rows).
using DotRowsFn = void (*)(const void* w, size_t w_stride, int64_t n_rows, const void* act,
                           int64_t n, float* out);
// out[t * out_stride + r] = dot(w + r * w_stride, act + t * act_stride) for r in
// [0, n_rows), t in [0, n_tok): a block of a matrix product.
using DotTileFn = void (*)(const void* w, size_t w_stride, int64_t n_rows, const void* act,
                           size_t act_stride, int64_t n_tok, int64_t n, float* out, size_t out_stride);

// dequant.cpp
void dequant_f32(const void*, float*, int64_t);
void dequant_f16(const void*, float*, int64_t);
void dequant_bf16(const void*, float*, int64_t);
void dequant_q4_0(const void*, float*, int64_t);
void dequant_q4_1(const void*, float*, int64_t);
void dequant_q5_0(const void*, float*, int64_t);
void dequant_q5_1(const void*, float*, int64_t);
void dequant_q8_0(const void*, float*, int64_t);
void dequant_q8_1(const void*, float*, int64_t);
void dequant_q2_k(const void*, float*, int64_t);
void dequant_q3_k(const void*, float*, int64_t);
void dequant_q4_k(const void*, float*, int64_t);
void dequant_q5_k(const void*, float*, int64_t);
void dequant_q6_k(const void*, float*, int64_t);
void dequant_q8_k(const void*, float*, int64_t);
void dequant_iq4_nl(const void*, float*, int64_t);
void dequant_iq4_xs(const void*, float*, int64_t);
void dequant_mxfp4(const void*, float*, int64_t);

// quantize.cpp (plain and legacy block types, activations)
void quantize_f32(const float*, void*, int64_t);
void quantize_f16(const float*, void*, int64_t);
void quantize_bf16(const float*, void*, int64_t);
void quantize_q4_0(const float*, void*, int64_t);
void quantize_q4_1(const float*, void*, int64_t);
void quantize_q5_0(const float*, void*, int64_t);
void quantize_q5_1(const float*, void*, int64_t);
void quantize_q8_0(const float*, void*, int64_t);
void quantize_q8_1(const float*, void*, int64_t);
void quantize_q8_k(const float*, void*, int64_t);
// quantize_k.cpp (K-quant weight types, ggml's *_ref search without an importance matrix)
void quantize_q4_k(const float*, void*, int64_t);
void quantize_q5_k(const float*, void*, int64_t);
void quantize_q6_k(const float*, void*, int64_t);

// dot_scalar.cpp / dot_scalar_k.cpp: the references every SIMD kernel is tested against.
float dot_f32_scalar(const void*, const void*, int64_t);
float dot_f16_scalar(const void*, const void*, int64_t);
float dot_bf16_scalar(const void*, const void*, int64_t);
float dot_q4_0_scalar(const void*, const void*, int64_t);
float dot_q4_1_scalar(const void*, const void*, int64_t);
float dot_q5_0_scalar(const void*, const void*, int64_t);
float dot_q5_1_scalar(const void*, const void*, int64_t);
float dot_q8_0_scalar(const void*, const void*, int64_t);
float dot_iq4_nl_scalar(const void*, const void*, int64_t);
float dot_mxfp4_scalar(const void*, const void*, int64_t);
float dot_q2_k_scalar(const void*, const void*, int64_t);
float dot_q3_k_scalar(const void*, const void*, int64_t);
float dot_q4_k_scalar(const void*, const void*, int64_t);
float dot_q5_k_scalar(const void*, const void*, int64_t);
float dot_q6_k_scalar(const void*, const void*, int64_t);
float dot_iq4_xs_scalar(const void*, const void*, int64_t);

}  // namespace frink::quant
