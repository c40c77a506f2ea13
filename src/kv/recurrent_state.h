// RecurrentState: the state of every recurrent layer (gated delta net, Mamba-2) of ONE
// sequence, on the host, with snapshots for rewinding.
//
// Authority: like KvCache, this host copy is the truth; a device copy, when one exists, is
// a mirror that must be re-uploaded after anything moves the state backwards (epoch()).
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

class RecurrentState {
 public:
  struct LayerShape {
    int64_t conv = 0;  // floats of convolution state
    int64_t ssm = 0;   // floats of SSM / delta-rule state
  };

  RecurrentState() = default;
  explicit RecurrentState(std::vector<LayerShape> layers);

  bool empty() const { return !any_; }  // no recurrent layer: nothing here matters
  uint64_t epoch() const { return epoch_; }

  float* conv(int64_t layer) { return live_[static_cast<size_t>(layer)].conv.data(); }
  float* ssm(int64_t layer) { return live_[static_cast<size_t>(layer)].ssm.data(); }

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
  // Positions with a snapshot, ascending (0 is implicit and not listed).
  std::vector<int64_t> snapshot_positions() const;

  // Restores the nearest snapshot at or before n (the zero state when none) and drops every
  // snapshot after n. Returns the restored position.
  int64_t restore(int64_t n);
  void reset();  // the zero state, no snapshots

 private:
  struct Layer {
    std::vector<float> conv, ssm;
  };
  std::vector<Layer> live_;
  std::map<int64_t, std::vector<Layer>> snapshots_;  // position -> every layer's state
  bool any_ = false;
  uint64_t epoch_ = 0;
  int64_t interval_ = 256;
  int64_t max_snapshots_ = 8;
  int64_t delta_chunk_ = 64;
};

}  // namespace frink
