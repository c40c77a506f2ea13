#include "cuda/device_probe.h"

#include <cuda_runtime.h>

namespace frink::cuda {

DeviceInfo probe_device() {
  DeviceInfo info;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    info.why_absent = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky "no device" so later calls start clean
    return info;
  }
  if (n == 0) {
    info.why_absent = "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, 0);
  if (err != cudaSuccess) {
    info.why_absent = cudaGetErrorString(err);
    return info;
  }
  if (prop.major < 8) {
    info.why_absent = "device is older than sm_80, which frink's kernels need";
    return info;
  }
  info.present = true;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  int clock_khz = 0, bus_bits = 0;  // attributes: cudaDeviceProp's clock fields left CUDA 13
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess)
    info.peak_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
  cudaGetLastError();
  return info;
}

}  // namespace frink::cuda
