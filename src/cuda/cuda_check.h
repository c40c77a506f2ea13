// Every CUDA and cuBLAS call is checked; a failure is a device FAILURE, reported as a
// frink::Error naming the call and its file:line (never folded into a refusal). C++17-clean:
// included by the .cu files.
#pragma once

#include <cuda_runtime.h>

namespace frink::cuda {

[[noreturn]] void cuda_failed(const char* call, const char* why, const char* file, int line);

}  // namespace frink::cuda

#define FRINK_CUDA_CHECK(call)                                                          \
  do {                                                                                  \
    const cudaError_t frink_err_ = (call);                                              \
    if (frink_err_ != cudaSuccess)                                                      \
      ::frink::cuda::cuda_failed(#call, cudaGetErrorString(frink_err_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define FRINK_CUDA_CHECK_LAUNCH() FRINK_CUDA_CHECK(cudaGetLastError())
