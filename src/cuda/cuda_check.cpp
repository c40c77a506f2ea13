#include "cuda/cuda_check.h"

#include "core/error.h"

namespace frink::cuda {

void cuda_failed(const char* call, const char* why, const char* file, int line) {
  fail("CUDA failure at {}:{}: {}: {}", file, line, call, why);
}

}  // namespace frink::cuda
