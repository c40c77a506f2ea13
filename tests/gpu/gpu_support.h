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
#include <vector>

#include <cuda_runtime.h>

#include "cuda/device_probe.h"
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
#endif

}  // namespace frink::test
