// The CUDA implementation of DeviceBackend (src/engine/device_backend.h): whole attention
// layers on one stream against each sequence's KV mirror, and whole gated-delta-net layers
// against its recurrent state mirror (src/cuda/recurrent_mirror.h).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/device_backend.h"
#include "model/model.h"

namespace frink::cuda {

// Uploads the model's device-eligible weights that fit (progress and memory logged; DecoderOptions
// says what n_gpu_layers and n_ctx mean). Precondition: probe_device().present. Throws
// frink::Error on a device failure.
std::unique_ptr<DeviceBackend> make_cuda_backend(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers = -1,
                                                 int64_t n_ctx = 4096);

}  // namespace frink::cuda
