#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace frink::cpu {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  // ggml sums squares in ggml_float (double) and scales in float.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / n);
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float d = x[i] - mean;
    var += static_cast<double>(d) * d;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(var / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * scale * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}

void norm(NormKind kind, const Norm& nm, const float* x, float* y, int64_t n, float eps) {
  if (kind == NormKind::kRms)
    rms_norm(x, nm.w, y, n, eps);
  else
    layer_norm(x, nm.w, nm.b, y, n, eps);
}

namespace {

// ggml's YaRN helpers (ggml-cpu ops.cpp rope_yarn / ggml_rope_yarn_corr_dims).
float yarn_corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

float yarn_ramp(float low, float high, int64_t i0) {
  const float y = (i0 / 2 - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

void rope(const RopeParams& rp, const float* freq_factors, float* x, int64_t n_head,
          int64_t head_dim, int64_t pos) {
  const int64_t n_rot = rp.n_rot;
  if (rp.kind == RopeKind::kNone || n_rot == 0) return;
  const float theta_scale = std::pow(rp.freq_base, -2.0f / static_cast<float>(n_rot));
  float corr0 = 0, corr1 = 0;
  if (rp.ext_factor != 0.0f) {
    corr0 = yarn_corr_dim(n_rot, rp.n_ctx_orig, rp.beta_fast, rp.freq_base);
    corr1 = yarn_corr_dim(n_rot, rp.n_ctx_orig, rp.beta_slow, rp.freq_base);
    if (rp.yarn_truncate) corr0 = std::floor(corr0), corr1 = std::ceil(corr1);
    corr0 = std::max(0.0f, corr0);
    corr1 = std::min(static_cast<float>(n_rot - 1), corr1);
  }
  // One cos/sin per pair, computed like ggml's rope_cache_init: theta multiplied along in
  // float, so our angles round exactly as llama.cpp's do.
  std::vector<float> cs(static_cast<size_t>(n_rot));
  float theta = static_cast<float>(pos);
  for (int64_t i0 = 0; i0 < n_rot; i0 += 2) {
    const float ff = freq_factors ? freq_factors[i0 / 2] : 1.0f;
    const float theta_extrap = theta / ff;
    const float theta_interp = rp.freq_scale * theta_extrap;
    float th = theta_interp;
    float mscale = rp.attn_factor;
    if (rp.ext_factor != 0.0f) {
      const float ramp_mix = yarn_ramp(corr0, corr1, i0) * rp.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / rp.freq_scale);
    }
    cs[static_cast<size_t>(i0)] = std::cos(th) * mscale;
    cs[static_cast<size_t>(i0 + 1)] = std::sin(th) * mscale;
    theta *= theta_scale;
  }
  for (int64_t h = 0; h < n_head; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i0 = 0; i0 < n_rot; i0 += 2) {
      const float c = cs[static_cast<size_t>(i0)], s = cs[static_cast<size_t>(i0 + 1)];
      // kNorm pairs neighbours; kNeox pairs element i with i + n_rot/2.
      const int64_t a = rp.kind == RopeKind::kNorm ? i0 : i0 / 2;
      const int64_t b = rp.kind == RopeKind::kNorm ? i0 + 1 : i0 / 2 + n_rot / 2;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void gelu_tanh_inplace(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * v * (1.0f + kCoef * v * v)));
  }
}

void softcap_inplace(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void softmax_inplace(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = x[i] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(x[i] - mx);
    x[i] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax_sink_inplace(float* x, int64_t n, float sink) {
  float mx = sink;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = x[i] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(x[i] - mx);
    x[i] = e;
    sum += e;
  }
  sum += std::exp(sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float alibi_slope(int64_t h, int64_t n_head, float max_bias) {
  // ggml_soft_max_ext: slopes for the largest power of two <= n_head, then the odd
  // interleaved ones for the rest.
  const int64_t n_head_log2 = int64_t{1} << static_cast<int64_t>(std::floor(std::log2(static_cast<double>(n_head))));
  const float m0 = std::pow(2.0f, -max_bias / n_head_log2);
  const float m1 = std::pow(2.0f, -(max_bias / 2.0f) / n_head_log2);
  return h < n_head_log2 ? std::pow(m0, static_cast<float>(h + 1))
                         : std::pow(m1, static_cast<float>(2 * (h - n_head_log2) + 1));
}

}  // namespace frink::cpu
