// RecurrentState: the state of every recurrent layer (gated delta net, Mamba-2) of ONE
// sequence, on the host, with snapshots for rewinding.
//
// Authority: like KvCache, this host copy is the truth that every host reader, snapshot,
// restore and copy sees. A device may run the recurrent layers too, and unlike K/V rows a
// recurrent state is rewritten whole every token (2 MiB per layer of an 80B hybrid), so a
// device that copied it back every step would spend more time copying than computing.
// Instead the device may be AHEAD for a layer: its copy (a RecurrentDeviceLink) holds the
// newer state and the host's is stale until pulled. The rule that keeps the host the truth:
// EVERY host access to a layer's state (conv(), ssm(), save_layer, copying the state) pulls
// an ahead layer first, so no reader can see a stale host copy, and nothing but this class
// needs to know a device exists. A pull costs one wait and one copy, and happens only where
// the host really reads (a layer the device refused, a snapshot, a copy).
//
// The other direction (device copy stale): every host change to a layer (a mutable conv()
// or ssm(), restore, reset, assignment) advances the layer's stamp(); the device trusts its
// copy only while it holds the stamp the copy was made from (or the layer is ahead), and
// re-uploads otherwise. As with the KV mirror, one upload is cheaper than enumerating every
// path that can change a state, and that enumeration is what would rot.
//
// Why snapshots: an attention cache truncates by dropping rows, but a recurrent state folds
// every token into a fixed-size summary and cannot be unfolded. To go back to position n
// the sequence restores the nearest snapshot at or before n and runs the tokens from there
// to n again. Position 0 (the zero state) is always available, so any rewind is possible;
// a snapshot at exactly n makes it free and exact.
//
// Which positions get one (chosen by the layer bodies through wants_snapshot): the end of
// every multi-token batch (a prompt, a chat turn: the usual rewind targets) and every
// multiple of snapshot_interval. At most max_snapshots are kept; the oldest go first.
//
// Layout per layer (floats): conv [d_conv - 1][channels], the last inputs oldest first;
// ssm as the layer body defines it (src/cpu/recurrent_layer.h). A layer with neither (an
// attention layer) has sizes 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace frink {

class RecurrentState;

// The device side of a RecurrentState whose newest layer states may live on a device
// (src/cuda's recurrent mirror). The state calls it; a link detaches (detach_device) before
// it goes away, and a state tells its link when it goes away or moves (forget).
class RecurrentDeviceLink {
 public:
  // Copies the device's state of `layer` into conv and ssm (host, the layer's sizes), after
  // waiting for the device work that writes it. Throws frink::Error on a device failure.
  virtual void pull(const RecurrentState& s, int64_t layer, float* conv, float* ssm) = 0;
  // s is being destroyed or moved from: drop its device copy. Never throws.
  virtual void forget(const RecurrentState& s) noexcept = 0;

 protected:
  ~RecurrentDeviceLink() = default;
};

class RecurrentState {
 public:
  struct LayerShape {
    int64_t conv = 0;  // floats of convolution state
    int64_t ssm = 0;   // floats of SSM / delta-rule state
  };

  RecurrentState() = default;
  explicit RecurrentState(std::vector<LayerShape> layers);
  // Copies and moves pull every ahead layer of the source first, so they copy the truth;
  // the result is not linked to a device. Assignment keeps the target's link but makes every
  // layer's device copy stale (new stamps).
  RecurrentState(const RecurrentState& o);
  RecurrentState(RecurrentState&& o);
  RecurrentState& operator=(const RecurrentState& o);
  RecurrentState& operator=(RecurrentState&& o);
  ~RecurrentState();

  bool empty() const { return !any_; }  // no recurrent layer: nothing here matters
  uint64_t epoch() const { return epoch_; }
  int64_t n_layer() const { return static_cast<int64_t>(live_.size()); }
  LayerShape shape(int64_t layer) const;

  // A layer's live state for the host to change: pulls it if the device is ahead, and makes
  // any device copy stale (the caller may write).
  float* conv(int64_t layer);
  float* ssm(int64_t layer);
  // The same for reading only: pulls, and leaves a device copy that equals it trusted.
  const float* conv(int64_t layer) const;
  const float* ssm(int64_t layer) const;

  // How prefill runs the delta rule: tokens per chunk (64, as llama.cpp), or 0 for token by
  // token (tests and benchmarks compare the two). A compute setting kept with the state so the
  // decoder needs no hybrid-specific option.
  int64_t delta_chunk() const { return delta_chunk_; }
  void set_delta_chunk(int64_t chunk) { delta_chunk_ = chunk; }

  // Snapshot policy: every multiple of interval (0 = none) plus every multi-token batch end.
  void set_snapshot_policy(int64_t interval, int64_t max_snapshots);
  // Whether the state after position pos (exclusive end) should be kept, for a batch of
  // tokens [batch_begin, batch_end).
  bool wants_snapshot(int64_t pos, int64_t batch_begin, int64_t batch_end) const;
  // Copies layer's live state into the snapshot at pos (created on first use).
  void save_layer(int64_t pos, int64_t layer);
  // The same with the state given (conv, ssm: the layer's sizes), for a device that computed
  // it: the live state is neither read nor changed.
  void save_layer(int64_t pos, int64_t layer, const float* conv, const float* ssm);
  // Positions with a snapshot, ascending (0 is implicit and not listed).
  std::vector<int64_t> snapshot_positions() const;

  // Restores the nearest snapshot at or before n (the zero state when none) and drops every
  // snapshot after n. Returns the restored position. A device copy ahead of the host is
  // discarded, not pulled: the restored state replaces it.
  int64_t restore(int64_t n);
  void reset();  // the zero state, no snapshots

  // The device side (see the header). attach_device: `link` will hold copies of this state
  // (a state linked to another device pulls that one's ahead layers and leaves it first).
  // detach_device: the link is going away: its ahead layers are pulled, then it is dropped.
  // set_device_ahead: the linked device now holds a newer state of `layer` than the host.
  // stamp: changes whenever the host changes the layer (the device's staleness test).
  void attach_device(RecurrentDeviceLink* link);
  void detach_device(const RecurrentDeviceLink* link);
  RecurrentDeviceLink* device() const { return device_; }
  void set_device_ahead(int64_t layer);
  bool device_ahead(int64_t layer) const { return ahead_[static_cast<size_t>(layer)] != 0; }
  uint64_t stamp(int64_t layer) const { return stamps_[static_cast<size_t>(layer)]; }

 private:
  struct Layer {
    std::vector<float> conv, ssm;
  };
  void pull(int64_t layer) const;  // when ahead: copies the device's state into live_
  void pull_all() const;
  void touch(int64_t layer) { ++stamps_[static_cast<size_t>(layer)]; }
  void touch_all();

  // mutable: a pull changes where the newest copy lives, never the state's value.
  mutable std::vector<Layer> live_;
  mutable std::vector<uint8_t> ahead_;  // per layer: the device holds a newer state
  // Per layer, only ever increasing in this object's life: a device copy recorded at an
  // older stamp can never match again. A new object at a reused address has no device copy
  // (the old one's destructor made its link forget it), so stamps need not be global.
  std::vector<uint64_t> stamps_;
  RecurrentDeviceLink* device_ = nullptr;
  std::map<int64_t, std::vector<Layer>> snapshots_;  // position -> every layer's state
  // One dropped snapshot's storage (its layers emptied, their capacity kept) for the next one
  // to fill: fresh vectors of a few MiB a layer are fresh pages, faulted in on every save
  // (an 8-layer qwen3-next's 12.6 MiB took 17-21 ms a prompt batch on the H200 host against
  // 5-6 ms where the allocator happened to hand the old pages back).
  void drop_snapshot(std::map<int64_t, std::vector<Layer>>::iterator it);
  std::vector<Layer> spare_;
  bool any_ = false;
  uint64_t epoch_ = 0;
  int64_t interval_ = 256;
  int64_t max_snapshots_ = 8;
  int64_t delta_chunk_ = 64;
};

}  // namespace frink
