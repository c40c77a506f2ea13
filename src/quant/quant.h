// Host kernels for GGUF block types: dequantize, quantize, and the fused dot product of a
// quantized weight row with an activation row. Activations are prepared ONCE per matmul
// input row in the format llama.cpp's CPU backend uses for that weight type
// (vec_dot_type), so our results match llama.cpp's to rounding. Each kernel has a scalar
// reference and AVX2/AVX-512 variants chosen at run time (the CPU is asked once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace frink {

// Whether the host can dequantize and dot this type (the column of the type table that
// the model loader checks before accepting a tensor).
bool host_supports(GgmlType t);

// dst[0..n) = values of the n elements at src (n a multiple of the block size).
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// Whether quantize_row exists for t (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, plus
// the plain F32/F16/BF16 and the activation types Q8_1, Q8_K).
bool can_quantize(GgmlType t);
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

// The activation type a weight type's dot product takes: F32->F32, F16->F16, BF16->BF16,
// Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4->Q8_0, Q4_1/Q5_1->Q8_1, K-quants and IQ4_XS->Q8_K.
GgmlType vec_dot_type(GgmlType weight);

// sum_i w[i] * a[i] over n elements; `act` holds the activation in vec_dot_type(weight)
// (made with quantize_row). The result equals the scalar reference up to float reordering.
float vec_dot(GgmlType weight, const void* w_row, const void* act, int64_t n);

// out[r] = vec_dot(weight, w_rows + r*w_stride, act, n) for r in [0, n_rows). Lets SIMD
// kernels reuse one activation load across several weight rows.
void vec_dot_rows(GgmlType weight, const void* w_rows, size_t w_stride, int64_t n_rows,
                  const void* act, int64_t n, float* out);

// out[t * out_stride + r] = vec_dot(weight, w_rows + r*w_stride, acts + t*act_stride, n)
// for r in [0, n_rows), t in [0, n_tok): an n_rows x n_tok block of a matrix product.
// SIMD kernels decode each weight block ONCE for several tokens (dot_x86_tile.h). Every
// element is BIT-IDENTICAL to vec_dot's (same operations in the same order), so a token's
// result does not depend on which tokens share its tile. Types without a tile kernel run
// vec_dot_rows per token.
void vec_dot_tile(GgmlType weight, const void* w_rows, size_t w_stride, int64_t n_rows, const void* acts,
                  size_t act_stride, int64_t n_tok, int64_t n, float* out, size_t out_stride);

// Which SIMD level the dispatcher picked ("scalar", "avx2", "avx512"), for logs and bench.
const char* host_simd_level();

// Forces the scalar reference (tests compare SIMD against it); returns the previous setting.
bool force_scalar_kernels(bool on);

}  // namespace frink
