#include "kv/recurrent_state.h"

#include <algorithm>

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
  auto it = snapshots_.find(pos);
  if (it == snapshots_.end()) {
    // Make room first: the oldest snapshots go (a rewind that far back replays from an
    // earlier one or from 0, which is slower but still exact).
    while (static_cast<int64_t>(snapshots_.size()) >= max_snapshots_ && !snapshots_.empty())
      snapshots_.erase(snapshots_.begin());
    it = snapshots_.emplace(pos, std::vector<Layer>(live_.size())).first;
  }
  it->second[static_cast<size_t>(layer)] = live_[static_cast<size_t>(layer)];
}

std::vector<int64_t> RecurrentState::snapshot_positions() const {
  std::vector<int64_t> out;
  for (const auto& [pos, _] : snapshots_) out.push_back(pos);
  return out;
}

int64_t RecurrentState::restore(int64_t n) {
  FRINK_ASSERT(n >= 0);
  snapshots_.erase(snapshots_.upper_bound(n), snapshots_.end());
  ++epoch_;
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
    snapshots_.erase(last);
  }
  return restore(0);
}

void RecurrentState::reset() {
  snapshots_.clear();
  restore(0);
}

}  // namespace frink
