// The host side of the type table: one QuantTraits row per GGUF type frink can decode and
// dot on the CPU (DESIGN.md section 5, STYLE.md "quant"). host_supports, can_quantize and
// vec_dot_type are columns of that table, never separate lists. The SIMD level is chosen
// ONCE (first use, thread-safe static) from what the CPU reports; force_scalar_kernels
// lets tests compare every SIMD kernel with its scalar reference.
#include <array>
#include <atomic>

#include "core/error.h"
#include "quant/dequant.h"
#include "quant/quant.h"
#include "quant/simd_kernels.h"

namespace frink {

namespace {

using namespace quant;

struct QuantTraits {
  GgmlType type;
  GgmlType vec_dot_type;  // the activation format llama.cpp's CPU backend pairs with it
  DequantFn dequant;
  QuantizeFn quantize;    // null: frink does not write this type
  DotFn dot_scalar;       // null: an activation-only type (never a matmul weight)
};

constexpr QuantTraits kTraits[] = {
    {GgmlType::F32, GgmlType::F32, dequant_f32, quantize_f32, dot_f32_scalar},
    {GgmlType::F16, GgmlType::F16, dequant_f16, quantize_f16, dot_f16_scalar},
    {GgmlType::BF16, GgmlType::BF16, dequant_bf16, quantize_bf16, dot_bf16_scalar},
    {GgmlType::Q4_0, GgmlType::Q8_0, dequant_q4_0, quantize_q4_0, dot_q4_0_scalar},
    {GgmlType::Q4_1, GgmlType::Q8_1, dequant_q4_1, quantize_q4_1, dot_q4_1_scalar},
    {GgmlType::Q5_0, GgmlType::Q8_0, dequant_q5_0, quantize_q5_0, dot_q5_0_scalar},
    {GgmlType::Q5_1, GgmlType::Q8_1, dequant_q5_1, quantize_q5_1, dot_q5_1_scalar},
    {GgmlType::Q8_0, GgmlType::Q8_0, dequant_q8_0, quantize_q8_0, dot_q8_0_scalar},
    {GgmlType::Q8_1, GgmlType::Q8_1, dequant_q8_1, quantize_q8_1, nullptr},
    {GgmlType::Q2_K, GgmlType::Q8_K, dequant_q2_k, nullptr, dot_q2_k_scalar},
    {GgmlType::Q3_K, GgmlType::Q8_K, dequant_q3_k, nullptr, dot_q3_k_scalar},
    {GgmlType::Q4_K, GgmlType::Q8_K, dequant_q4_k, quantize_q4_k, dot_q4_k_scalar},
    {GgmlType::Q5_K, GgmlType::Q8_K, dequant_q5_k, quantize_q5_k, dot_q5_k_scalar},
    {GgmlType::Q6_K, GgmlType::Q8_K, dequant_q6_k, quantize_q6_k, dot_q6_k_scalar},
    {GgmlType::Q8_K, GgmlType::Q8_K, dequant_q8_k, quantize_q8_k, nullptr},
    {GgmlType::IQ4_NL, GgmlType::Q8_0, dequant_iq4_nl, nullptr, dot_iq4_nl_scalar},
    {GgmlType::IQ4_XS, GgmlType::Q8_K, dequant_iq4_xs, nullptr, dot_iq4_xs_scalar},
    {GgmlType::MXFP4, GgmlType::Q8_0, dequant_mxfp4, nullptr, dot_mxfp4_scalar},
};

const QuantTraits* find_traits(GgmlType t) {
  for (const auto& row : kTraits)
    if (row.type == t) return &row;
  return nullptr;
}

const QuantTraits& traits(GgmlType t) {
  const QuantTraits* row = find_traits(t);
  FRINK_ASSERT(row != nullptr, "no host kernels for {}", ggml_type_name(t));
  return *row;
}

// The one-time choice: which kernel set the CPU can run, and its kernel per type id.
struct Dispatch {
  const char* level = "scalar";
  std::array<SimdDot, 64> simd{};  // indexed by the GGML type id (all < 64)
};

Dispatch choose() {
  Dispatch d;
  __builtin_cpu_init();
  SimdDot (*table)(GgmlType) = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    d.level = "avx512";
    table = avx512_dot_kernel;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    d.level = "avx2";
    table = avx2_dot_kernel;
  }
  if (table)
    for (const auto& row : kTraits) d.simd[static_cast<size_t>(row.type)] = table(row.type);
  return d;
}

const Dispatch& dispatch() {
  static const Dispatch d = choose();
  return d;
}

// Tests only (force_scalar_kernels); relaxed is enough, callers set it before computing.
std::atomic<bool> g_force_scalar{false};

void check_row(GgmlType t, int64_t n) {
  const auto& info = ggml_type_info(t);
  FRINK_ASSERT(n % info.block_elems == 0, "row of {} elements is not a whole number of {} blocks", n, info.name);
}

}  // namespace

bool host_supports(GgmlType t) {
  const QuantTraits* row = find_traits(t);
  return row != nullptr && row->dot_scalar != nullptr;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  check_row(t, n);
  traits(t).dequant(src, dst, n);
}

bool can_quantize(GgmlType t) {
  const QuantTraits* row = find_traits(t);
  return row != nullptr && row->quantize != nullptr;
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  check_row(t, n);
  const QuantTraits& row = traits(t);
  FRINK_ASSERT(row.quantize != nullptr, "quantize_row: frink does not write {}", ggml_type_name(t));
  row.quantize(src, dst, n);
}

GgmlType vec_dot_type(GgmlType weight) { return traits(weight).vec_dot_type; }

float vec_dot(GgmlType weight, const void* w_row, const void* act, int64_t n) {
  const QuantTraits& row = traits(weight);
  FRINK_ASSERT(row.dot_scalar != nullptr, "{} is not a weight type", ggml_type_name(weight));
  check_row(weight, n);
  const SimdDot& simd = dispatch().simd[static_cast<size_t>(weight)];
  if (simd.dot && !g_force_scalar.load(std::memory_order_relaxed)) return simd.dot(w_row, act, n);
  return row.dot_scalar(w_row, act, n);
}

void vec_dot_rows(GgmlType weight, const void* w_rows, size_t w_stride, int64_t n_rows, const void* act,
                  int64_t n, float* out) {
  const QuantTraits& row = traits(weight);
  FRINK_ASSERT(row.dot_scalar != nullptr, "{} is not a weight type", ggml_type_name(weight));
  check_row(weight, n);
  const SimdDot& simd = dispatch().simd[static_cast<size_t>(weight)];
  const bool scalar = g_force_scalar.load(std::memory_order_relaxed);
  if (simd.rows && !scalar) return simd.rows(w_rows, w_stride, n_rows, act, n, out);
  const DotFn dot = simd.dot && !scalar ? simd.dot : row.dot_scalar;
  const auto* base = static_cast<const char*>(w_rows);
  for (int64_t r = 0; r < n_rows; ++r) out[r] = dot(base + r * w_stride, act, n);
}

void vec_dot_tile(GgmlType weight, const void* w_rows, size_t w_stride, int64_t n_rows, const void* acts,
                  size_t act_stride, int64_t n_tok, int64_t n, float* out, size_t out_stride) {
  const QuantTraits& row = traits(weight);
  FRINK_ASSERT(row.dot_scalar != nullptr, "{} is not a weight type", ggml_type_name(weight));
  check_row(weight, n);
  const SimdDot& simd = dispatch().simd[static_cast<size_t>(weight)];
  if (simd.tile && !g_force_scalar.load(std::memory_order_relaxed))
    return simd.tile(w_rows, w_stride, n_rows, acts, act_stride, n_tok, n, out, out_stride);
  const auto* act = static_cast<const char*>(acts);
  for (int64_t t = 0; t < n_tok; ++t)
    vec_dot_rows(weight, w_rows, w_stride, n_rows, act + t * act_stride, n, out + t * out_stride);
}

const char* host_simd_level() { return g_force_scalar.load() ? "scalar" : dispatch().level; }

bool force_scalar_kernels(bool on) { return g_force_scalar.exchange(on); }

}  // namespace frink
