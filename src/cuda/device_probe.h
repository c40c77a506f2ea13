// What CUDA device, if any, this process can use. Safe to call on a machine without a GPU
// or driver: it then reports present == false with the reason.
#pragma once

#include <cstddef>
#include <string>

namespace frink::cuda {

struct DeviceInfo {
  bool present = false;
  std::string name;            // "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;
  size_t total_bytes = 0;
  double peak_gbps = 0;        // theoretical memory bandwidth: 2 x memory clock x bus width
  std::string why_absent;      // when !present: the driver's own words
};

DeviceInfo probe_device();

}  // namespace frink::cuda
