#include "kv/recurrent_state.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace frink {

RecurrentState::RecurrentState(std::vector<LayerShape> layers) {
  live_.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    FRINK_ASSERT(layers[i].conv >= 0 && layers[i].ssm >= 0);
    live_[i].conv.assign(static_cast<size_t>(layers[i].conv), 0.0f);
    live_[i].ssm.assign(static_cast<size_t>(layers[i].ssm), 0.0f);
    any_ = any_ || layers[i].conv > 0 || layers[i].ssm > 0;
  }
  ahead_.assign(layers.size(), 0);
  stamps_.assign(layers.size(), 0);
}

RecurrentState::RecurrentState(const RecurrentState& o)
    : snapshots_(o.snapshots_), any_(o.any_), epoch_(o.epoch_), interval_(o.interval_),
      max_snapshots_(o.max_snapshots_), delta_chunk_(o.delta_chunk_) {
  o.pull_all();
  live_ = o.live_;
  ahead_.assign(live_.size(), 0);
  stamps_.assign(live_.size(), 0);
}

RecurrentState::RecurrentState(RecurrentState&& o)
    : any_(o.any_), epoch_(o.epoch_), interval_(o.interval_), max_snapshots_(o.max_snapshots_),
      delta_chunk_(o.delta_chunk_) {
  o.pull_all();
  if (o.device_) o.device_->forget(o);  // its device copy is keyed by o's address
  o.device_ = nullptr;
  live_ = std::move(o.live_);
  snapshots_ = std::move(o.snapshots_);
  ahead_.assign(live_.size(), 0);
  stamps_.assign(live_.size(), 0);
  o.live_.clear();
  o.ahead_.clear();
  o.stamps_.clear();
  o.any_ = false;
}

RecurrentState& RecurrentState::operator=(const RecurrentState& o) {
  if (this == &o) return *this;
  o.pull_all();
  // The layers' shapes change: the device copy no longer fits, so it goes.
  bool same_shape = live_.size() == o.live_.size();
  for (size_t i = 0; same_shape && i < live_.size(); ++i)
    same_shape = live_[i].conv.size() == o.live_[i].conv.size() && live_[i].ssm.size() == o.live_[i].ssm.size();
  if (!same_shape && device_) {
    device_->forget(*this);
    device_ = nullptr;
  }
  live_ = o.live_;
  snapshots_ = o.snapshots_;
  any_ = o.any_;
  epoch_ = o.epoch_;
  interval_ = o.interval_;
  max_snapshots_ = o.max_snapshots_;
  delta_chunk_ = o.delta_chunk_;
  ahead_.assign(live_.size(), 0);  // whatever the device held for this object is replaced
  stamps_.resize(live_.size(), 0);
  touch_all();
  return *this;
}

RecurrentState& RecurrentState::operator=(RecurrentState&& o) {
  if (this == &o) return *this;
  *this = static_cast<const RecurrentState&>(o);  // the copy's rules; then o lets go
  if (o.device_) o.device_->forget(o);
  o.device_ = nullptr;
  return *this;
}

RecurrentState::~RecurrentState() {
  if (device_) device_->forget(*this);
}

RecurrentState::LayerShape RecurrentState::shape(int64_t layer) const {
  const Layer& l = live_[static_cast<size_t>(layer)];
  return {static_cast<int64_t>(l.conv.size()), static_cast<int64_t>(l.ssm.size())};
}

float* RecurrentState::conv(int64_t layer) {
  pull(layer);
  touch(layer);
  return live_[static_cast<size_t>(layer)].conv.data();
}

float* RecurrentState::ssm(int64_t layer) {
  pull(layer);
  touch(layer);
  return live_[static_cast<size_t>(layer)].ssm.data();
}

const float* RecurrentState::conv(int64_t layer) const {
  pull(layer);
  return live_[static_cast<size_t>(layer)].conv.data();
}

const float* RecurrentState::ssm(int64_t layer) const {
  pull(layer);
  return live_[static_cast<size_t>(layer)].ssm.data();
}

void RecurrentState::pull(int64_t layer) const {
  const size_t i = static_cast<size_t>(layer);
  if (!ahead_[i]) return;
  FRINK_ASSERT(device_, "layer {} is ahead on a device, but no device is linked", layer);
  device_->pull(*this, layer, live_[i].conv.data(), live_[i].ssm.data());
  ahead_[i] = 0;  // the device copy and the host agree now
}

void RecurrentState::pull_all() const {
  for (int64_t l = 0; l < n_layer(); ++l) pull(l);
}

void RecurrentState::touch_all() {
  for (auto& s : stamps_) ++s;
}

void RecurrentState::attach_device(RecurrentDeviceLink* link) {
  if (device_ == link) return;
  if (device_) {
    pull_all();
    device_->forget(*this);
  }
  device_ = link;
}

void RecurrentState::detach_device(const RecurrentDeviceLink* link) {
  if (device_ != link) return;
  pull_all();
  device_ = nullptr;
}

void RecurrentState::set_device_ahead(int64_t layer) {
  FRINK_ASSERT(device_, "set_device_ahead({}) with no device linked", layer);
  ahead_[static_cast<size_t>(layer)] = 1;
}

void RecurrentState::set_snapshot_policy(int64_t interval, int64_t max_snapshots) {
  FRINK_ASSERT(interval >= 0 && max_snapshots >= 0);
  interval_ = interval;
  max_snapshots_ = max_snapshots;
}

bool RecurrentState::wants_snapshot(int64_t pos, int64_t batch_begin, int64_t batch_end) const {
  if (max_snapshots_ == 0 || pos <= 0) return false;
  if (pos == batch_end && batch_end - batch_begin > 1) return true;
  return interval_ > 0 && pos % interval_ == 0;
}

void RecurrentState::save_layer(int64_t pos, int64_t layer) {
  pull(layer);
  const Layer& l = live_[static_cast<size_t>(layer)];
  save_layer(pos, layer, l.conv.data(), l.ssm.data());
}

void RecurrentState::save_layer(int64_t pos, int64_t layer, const float* conv, const float* ssm) {
  auto it = snapshots_.find(pos);
  if (it == snapshots_.end()) {
    // Make room first: the oldest snapshots go (a rewind that far back replays from an
    // earlier one or from 0, which is slower but still exact).
    while (static_cast<int64_t>(snapshots_.size()) >= max_snapshots_ && !snapshots_.empty())
      drop_snapshot(snapshots_.begin());
    if (spare_.size() != live_.size()) spare_.assign(live_.size(), Layer{});
    it = snapshots_.emplace(pos, std::move(spare_)).first;
    spare_.clear();
  }
  const Layer& live = live_[static_cast<size_t>(layer)];
  Layer& saved = it->second[static_cast<size_t>(layer)];
  saved.conv.assign(conv, conv + live.conv.size());
  saved.ssm.assign(ssm, ssm + live.ssm.size());
}

std::vector<int64_t> RecurrentState::snapshot_positions() const {
  std::vector<int64_t> out;
  for (const auto& [pos, _] : snapshots_) out.push_back(pos);
  return out;
}

int64_t RecurrentState::restore(int64_t n) {
  FRINK_ASSERT(n >= 0);
  while (!snapshots_.empty() && std::prev(snapshots_.end())->first > n) drop_snapshot(std::prev(snapshots_.end()));
  ++epoch_;
  // Every layer is replaced: a device copy ahead of the host is discarded unread.
  std::fill(ahead_.begin(), ahead_.end(), 0);
  touch_all();
  if (snapshots_.empty()) {
    for (auto& l : live_) {
      std::fill(l.conv.begin(), l.conv.end(), 0.0f);
      std::fill(l.ssm.begin(), l.ssm.end(), 0.0f);
    }
    return 0;
  }
  // Only a snapshot every recurrent layer saved counts (one evicted mid-batch and re-created
  // by later layers is partial); partial ones are dropped on the way down.
  while (!snapshots_.empty()) {
    auto last = std::prev(snapshots_.end());
    bool complete = true;
    for (size_t i = 0; i < live_.size(); ++i) complete = complete && last->second[i].ssm.size() == live_[i].ssm.size() &&
                                                         last->second[i].conv.size() == live_[i].conv.size();
    if (complete) {
      live_ = last->second;
      return last->first;
    }
    drop_snapshot(last);
  }
  return restore(0);
}

void RecurrentState::drop_snapshot(std::map<int64_t, std::vector<Layer>>::iterator it) {
  // Emptied, so a snapshot made from it is complete only where every layer saves again (restore).
  for (Layer& l : it->second) {
    l.conv.clear();
    l.ssm.clear();
  }
  spare_ = std::move(it->second);
  snapshots_.erase(it);
}

void RecurrentState::reset() {
  snapshots_.clear();
  restore(0);
}

}  // namespace frink
