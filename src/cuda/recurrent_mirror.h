// RecurrentMirror: the device copy of ONE sequence's RecurrentState (src/kv/recurrent_state.h),
// for the recurrent layers the device runs: each layer's conv state and delta-rule state, in
// the host's layout, so an upload or a pull is one copy each.
//
// Authority: the host RecurrentState is the truth, but unlike a KV mirror this copy is not
// copied back after every token (a layer's state is rewritten whole each token: 2 MiB per
// layer of an 80B hybrid). After device work on a layer lands, the state is told the device
// is AHEAD for it (set_device_ahead), and any host access pulls it from here first (the
// state's rule, which is why no host reader needs to know about this class).
//
// Two copies a layer: the current one, and another that a token graph writes the next state
// into (CudaBackend::run_token), current once that step has landed (landed with flip). Why:
// a decode step enqueued ahead of its call reads the state the step before it writes and
// must leave the current one as it was, since it may be dropped (a stop token, another
// sequence, a rewind). Batches run layer by layer update the current copy in place.
//
// Staleness: before device work on a layer the copy is trusted only when the layer is ahead
// (then this copy IS the newest) or the copy was made from the host's present stamp();
// otherwise the host's state is uploaded whole. Between enqueueing work on a layer and its
// landing (the wait at the end of the batch) the copy matches no stamp: a batch that fails
// on the device leaves it untrusted, and a pull of such a layer is an error, never a silent
// read of a half-updated state.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "kv/recurrent_state.h"

namespace frink::cuda {

class RecurrentMirror {
 public:
  // Device memory for every layer l with on_device[l] and a non-empty state; nothing is
  // uploaded yet (every layer starts untrusted).
  RecurrentMirror(const RecurrentState& s, const std::vector<bool>& on_device);
  ~RecurrentMirror();
  RecurrentMirror(const RecurrentMirror&) = delete;
  RecurrentMirror& operator=(const RecurrentMirror&) = delete;

  bool has(int64_t layer) const { return layers_[static_cast<size_t>(layer)].held; }
  // Which of the layer's two copies is current (0 or 1), and each copy's buffers.
  int half(int64_t layer) const { return layers_[static_cast<size_t>(layer)].half; }
  float* conv(int64_t layer, int h) { return copy(h) + layers_[static_cast<size_t>(layer)].conv_off; }
  float* ssm(int64_t layer, int h) { return copy(h) + layers_[static_cast<size_t>(layer)].ssm_off; }
  float* conv(int64_t layer) { return conv(layer, half(layer)); }
  float* ssm(int64_t layer) { return ssm(layer, half(layer)); }
  size_t bytes() const { return 2 * floats_ * sizeof(float); }
  int64_t n_uploads() const { return n_uploads_; }  // layer uploads so far (tests, logs)

  // Before device work on layer: uploads the host's state unless this copy is current.
  void prepare(const RecurrentState& s, int64_t layer, cudaStream_t stream);
  // Device work on layer is enqueued: the copy matches no stamp until landed().
  void running(int64_t layer);
  // That work finished (the stream was waited for): the state learns the device is ahead.
  // flip: the work wrote the other copy, which is now the current one.
  void landed(RecurrentState& s, int64_t layer, bool flip);
  // Whether copy h of the layer holds the host's newest state: current, trusted, and no host
  // change since it was made or landed (a step enqueued ahead from copy h is still right).
  bool holds_newest(const RecurrentState& s, int64_t layer, int h) const;
  // Copies layer's device state into host conv / ssm, waiting for the stream first.
  void pull(int64_t layer, float* conv, float* ssm, cudaStream_t stream);

 private:
  struct Layer {
    bool held = false;
    size_t conv_off = 0, ssm_off = 0;  // floats into buf_
    int64_t conv_n = 0, ssm_n = 0;
    bool trusted = false;  // equals the host state at `stamp` (or is ahead of it)
    uint64_t stamp = 0;
    int half = 0;          // the current copy
  };
  float* copy(int h) { return buf_ + static_cast<size_t>(h) * floats_; }
  float* buf_ = nullptr;  // two copies of floats_ each
  size_t floats_ = 0;
  std::vector<Layer> layers_;
  int64_t n_uploads_ = 0;
};

}  // namespace frink::cuda
