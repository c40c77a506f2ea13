// Helpers for the device tests: skipping cleanly without a GPU (or in a build without
// CUDA), and finding fixture files on the GPU machine, where ../shared does not travel:
// FRINK_GPU_TESTDATA (a folder laid out like ../shared/testdata, e.g. .fixtures/gpu copied
// by tools) wins over the shared folder.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "support/test_support.h"
#ifdef FRINK_HAVE_CUDA
#include <algorithm>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/attention.cuh"
#include "cuda/device_probe.h"
#include "cuda/device_weights.h"
#include "cuda/matmul.cuh"
#include "cuda/rope.cuh"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"
#endif

namespace frink::test {

inline bool gpu_present() {
#ifdef FRINK_HAVE_CUDA
  static const bool present = cuda::probe_device().present;
  return present;
#else
  return false;
#endif
}

#define FRINK_REQUIRE_GPU()                                                         \
  do {                                                                              \
    if (!::frink::test::gpu_present())                                              \
      GTEST_SKIP() << "no usable CUDA device (or a build without CUDA); skipping";  \
  } while (0)

// The testdata folder for device tests, or empty.
inline std::filesystem::path gpu_testdata() {
  if (const char* env = std::getenv("FRINK_GPU_TESTDATA"); env && std::filesystem::is_directory(env))
    return std::filesystem::path(env);
  return shared_testdata();
}

// A transformers fixture's folder (SafeTensors, committed under tests/fixtures/hf);
// FRINK_HF_FIXTURES: the folder on a machine where the build's source path does not exist.
inline std::filesystem::path hf_fixture(const char* name) {
  const char* env = std::getenv("FRINK_HF_FIXTURES");
  return (env ? std::filesystem::path(env) : std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf") / name;
}

#define FRINK_REQUIRE_GPU_DATA(rel)                                                          \
  do {                                                                                       \
    if (::frink::test::gpu_testdata().empty() ||                                             \
        !std::filesystem::exists(::frink::test::gpu_testdata() / (rel)))                     \
      GTEST_SKIP() << "fixture " << (rel) << " absent (set FRINK_GPU_TESTDATA); skipping";   \
  } while (0)

#ifdef FRINK_HAVE_CUDA
// A device copy of a host vector, freed at scope end.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    if (n) {
      EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  explicit Dev(size_t count) : Dev(std::vector<T>(count, T(-1e30f))) {}  // poisoned
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// n_out random rows of type t (as the file would hold them) and their exact dequantization.
struct RandomWeights {
  std::vector<uint8_t> bytes;
  std::vector<float> f;
};
inline RandomWeights random_weights(std::mt19937& rng, GgmlType t, int64_t n_in, int64_t n_out) {
  RandomWeights w;
  w.f.resize(static_cast<size_t>(n_in * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    auto row = random_weight_row(rng, t, n_in);
    dequantize_row(t, row.data(), w.f.data() + r * n_in, n_in);
    w.bytes.insert(w.bytes.end(), row.begin(), row.end());
  }
  return w;
}

// A product of W (type t, n_out rows of n_in, on the device) with x [n_tok][n_in] into
// y [n_tok][n_out]; callers set bias, scale, act_round and the cuBLAS fields they test.
inline cuda::MatmulParams mat_params(GgmlType t, const void* w, int64_t n_in, int64_t n_out, const float* x,
                                     int64_t n_tok, float* y) {
  cuda::MatmulParams p;
  p.type = static_cast<int>(t);
  p.w = w;
  p.row_bytes = ggml_row_bytes(t, n_in);
  p.n_in = n_in;
  p.n_out = n_out;
  p.x = x;
  p.x_stride = n_in;
  p.y = y;
  p.y_stride = n_out;
  p.n_tok = n_tok;
  return p;
}

// Rows of type t (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K or MXFP4) at w (n_bytes on the device, rows of
// whole groups or tiles, or padded as device_rows pads them) reordered in place as the device keeps them
// (matmul.cuh, x8_type); returns the type id products of them take.
inline int to_x8(GgmlType t, void* w, size_t n_bytes, int64_t n_in) {
  cuda::repack_x8(static_cast<int>(t), w, n_bytes, n_in, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int x8 = cuda::x8_type(static_cast<int>(t), n_in);
  EXPECT_NE(x8, static_cast<int>(t));
  return x8;
}

// Rows of type t and width n_in (as the file holds them) padded with zeros as the device keeps
// them (cuda::device_row_bytes), which the x8 layouts of partial groups need.
inline size_t device_row(GgmlType t, int64_t n_in) {
  return cuda::device_row_bytes(static_cast<int>(t), n_in, ggml_row_bytes(t, n_in));
}
inline std::vector<uint8_t> device_rows(const std::vector<uint8_t>& bytes, GgmlType t, int64_t n_in) {
  const std::vector<char> out =
      cuda::padded_rows({{bytes.data(), bytes.size()}}, ggml_row_bytes(t, n_in), device_row(t, n_in));
  return {out.begin(), out.end()};
}

// RoPE over q [n_tok][n_head * head_dim] and k [n_tok][n_head_kv * head_dim] at device
// position *pos; callers set the frequencies and style they test.
inline cuda::RopeLaunch rope_launch(float* q, float* k, int64_t n_tok, int64_t n_head, int64_t n_head_kv,
                                    int64_t head_dim, int64_t n_rot, const int32_t* pos) {
  cuda::RopeLaunch r;
  r.x = q;
  r.row_stride = n_head * head_dim;
  r.n_tok = n_tok;
  r.n_head = n_head;
  r.head_dim = head_dim;
  r.x2 = k;
  r.row_stride2 = n_head_kv * head_dim;
  r.n_head2 = n_head_kv;
  r.pos = pos;
  r.n_rot = n_rot;
  return r;
}

// Attention of q [n_tok][n_head * head_dim] against the mirrors' K/V rows [max_keys][n_head_kv *
// head_dim] from device position *pos, into out, with the split-K scratch `partial`; callers
// set the scale and the features they test (softcap, window, ALiBi, sinks, Q8 output).
inline cuda::AttnParams attn_params(const float* q, const float* k, const float* v, float* out, float* partial,
                                    int64_t n_tok, const int32_t* pos, int64_t max_keys, int64_t n_head,
                                    int64_t n_head_kv, int64_t head_dim) {
  cuda::AttnParams p;
  p.q = q;
  p.q_stride = n_head * head_dim;
  p.k = k;
  p.v = v;
  p.out = out;
  p.partial = partial;
  p.n_tok = n_tok;
  p.pos = pos;
  p.max_keys = max_keys;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.head_dim_k = p.head_dim_v = head_dim;
  return p;
}

// r's K/V append: v [n_tok][v_width], the mirror's K/V rows and the staging rows.
inline void rope_append(cuda::RopeLaunch& r, float* v, int64_t v_width, float* mirror_k, float* mirror_v,
                        float* stage_k, float* stage_v) {
  r.v = v;
  r.v_width = v_width;
  r.mirror_k = mirror_k;
  r.mirror_v = mirror_v;
  r.stage_k = stage_k;
  r.stage_v = stage_v;
}
#endif

}  // namespace frink::test
