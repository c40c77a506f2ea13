#include "cuda/recurrent_mirror.h"

#include <utility>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace frink::cuda {

RecurrentMirror::RecurrentMirror(const RecurrentState& s, const std::vector<bool>& on_device) {
  layers_.resize(static_cast<size_t>(s.n_layer()));
  for (int64_t l = 0; l < s.n_layer(); ++l) {
    const RecurrentState::LayerShape shape = s.shape(l);
    Layer& ly = layers_[static_cast<size_t>(l)];
    if (static_cast<size_t>(l) >= on_device.size() || !on_device[static_cast<size_t>(l)] || shape.conv + shape.ssm == 0)
      continue;
    ly.held = true;
    ly.conv_n = shape.conv;
    ly.ssm_n = shape.ssm;
    ly.conv_off = floats_;
    ly.ssm_off = floats_ + static_cast<size_t>(shape.conv);
    floats_ += static_cast<size_t>(shape.conv + shape.ssm);
  }
  if (floats_ > 0) FRINK_CUDA_CHECK(cudaMalloc(&buf_, 2 * floats_ * sizeof(float)));
}

RecurrentMirror::~RecurrentMirror() {
  cudaFree(buf_);  // not thrown from a destructor; a failed free at exit changes nothing
}

void RecurrentMirror::prepare(const RecurrentState& s, int64_t layer, cudaStream_t stream) {
  Layer& ly = layers_[static_cast<size_t>(layer)];
  FRINK_ASSERT(ly.held, "layer {} has no device state", layer);
  if (s.device_ahead(layer)) {
    // Ahead means this copy is the newest, and the host has not changed the layer since;
    // untrusted as well: the work that made it ahead again failed (see pull).
    if (!ly.trusted) fail("the device's recurrent state of layer {} was lost in a failed device batch", layer);
    FRINK_ASSERT(ly.stamp == s.stamp(layer), "layer {} ahead on the device, but the host changed it", layer);
    return;
  }
  if (ly.trusted && ly.stamp == s.stamp(layer)) return;
  const RecurrentState& host = s;  // the reading accessors: no stamp change (and nothing to pull)
  if (ly.conv_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(conv(layer), host.conv(layer), static_cast<size_t>(ly.conv_n) * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
  if (ly.ssm_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(ssm(layer), host.ssm(layer), static_cast<size_t>(ly.ssm_n) * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
  ly.trusted = true;
  ly.stamp = s.stamp(layer);
  ++n_uploads_;
}

void RecurrentMirror::running(int64_t layer) { layers_[static_cast<size_t>(layer)].trusted = false; }

void RecurrentMirror::landed(RecurrentState& s, int64_t layer, bool flip) {
  Layer& ly = layers_[static_cast<size_t>(layer)];
  if (flip) ly.half ^= 1;
  ly.trusted = true;
  ly.stamp = s.stamp(layer);
  s.set_device_ahead(layer);
}

bool RecurrentMirror::holds_newest(const RecurrentState& s, int64_t layer, int h) const {
  const Layer& ly = layers_[static_cast<size_t>(layer)];
  return ly.held && ly.half == h && ly.trusted && ly.stamp == s.stamp(layer);
}

void RecurrentMirror::pull(int64_t layer, float* conv_out, float* ssm_out, cudaStream_t stream) {
  Layer& ly = layers_[static_cast<size_t>(layer)];
  // Untrusted here means device work on the layer was enqueued and never landed: a batch
  // that failed on the device. The newest state existed only here and is lost.
  if (!ly.held || !ly.trusted)
    fail("the device's recurrent state of layer {} was lost in a failed device batch", layer);
  if (ly.conv_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(conv_out, conv(layer), static_cast<size_t>(ly.conv_n) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
  if (ly.ssm_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(ssm_out, ssm(layer), static_cast<size_t>(ly.ssm_n) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
  FRINK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace frink::cuda
