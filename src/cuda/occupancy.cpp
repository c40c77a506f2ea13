#include "cuda/occupancy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace frink::cuda {

int64_t resident_blocks(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int64_t> known;
  int dev = 0;
  FRINK_CUDA_CHECK(cudaGetDevice(&dev));
  const auto key = std::make_tuple(dev, kernel, threads, smem);
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0;
  FRINK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t n = int64_t{sm_count()} * per_sm;
  if (n > 0) known.emplace(key, n);
  return n;
}

int sm_count() {
  static std::mutex mu;
  static std::map<int, int> known;
  int dev = 0;
  FRINK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(dev); it != known.end()) return it->second;
  int sms = 0;
  FRINK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  known.emplace(dev, sms);
  return sms;
}

void opt_in_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> opted;  // the most each kernel may take
  int dev = 0;
  FRINK_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  size_t& have = opted[{dev, kernel}];
  if (have >= bytes) return;
  int optin = 0;
  FRINK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t n = std::min(bytes, static_cast<size_t>(optin));
  FRINK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(n)));
  have = std::max(have, bytes);  // asked past the limit: the limit, and never asked again
}

}  // namespace frink::cuda
