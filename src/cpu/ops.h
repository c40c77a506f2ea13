// Host element-wise and row operations, one op per function, f32 in and out. These are
// the reference the device kernels are tested against, so they follow ggml's CPU formulas
// (same order of operations where it changes rounding).
#pragma once

#include <cstdint>

#include "model/hparams.h"
#include "model/weights.h"

namespace frink::cpu {

// y = x / sqrt(mean(x^2) + eps) * w      (w may be null: no weight)
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// y = (x - mean) / sqrt(var + eps) * w + b
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps);
// Either of the above, by the model's norm kind.
void norm(NormKind kind, const Norm& nm, const float* x, float* y, int64_t n, float eps);

// Rotates the first rope.n_rot dims of each of n_head heads of width head_dim at position
// pos, in place. freq_factors: [n_rot/2] divisors of each pair's angle, or null.
void rope(const RopeParams& rope, const float* freq_factors, float* x, int64_t n_head,
          int64_t head_dim, int64_t pos);

void silu_inplace(float* x, int64_t n);
void gelu_tanh_inplace(float* x, int64_t n);
void softcap_inplace(float* x, int64_t n, float cap);  // x = cap * tanh(x / cap)
// Softmax over n values in place (max-subtracted; -inf entries become 0).
void softmax_inplace(float* x, int64_t n);
// The same with one more logit, `sink`, in the denominator only (ggml_soft_max_add_sinks:
// the max includes the sink, the sum adds exp(sink - max)); the n outputs sum to < 1.
void softmax_sink_inplace(float* x, int64_t n, float sink);

// ALiBi slope of head h of n_head with the given max bias (ggml_soft_max_ext's formula).
float alibi_slope(int64_t h, int64_t n_head, float max_bias);

}  // namespace frink::cpu
