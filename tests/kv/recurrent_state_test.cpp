// RecurrentState's snapshots: a restore gives back exactly the state saved at that position,
// including when the snapshot was filled into the storage of one dropped before (the state
// recycles it: fresh pages cost a fault each), and a snapshot that not every layer saved
// again is never taken for a whole one.
#include "kv/recurrent_state.h"

#include <gtest/gtest.h>

#include <vector>

namespace frink {
namespace {

// Two recurrent layers around an attention layer (no state), as a hybrid's.
RecurrentState make_state() { return RecurrentState({{6, 10}, {0, 0}, {4, 8}}); }

std::vector<float> filled(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

// Saves layers 0 and 2 at pos with values from base (as a device would hand them over).
void save_all(RecurrentState& s, int64_t pos, float base, bool only_first = false) {
  const auto c0 = filled(6, base), s0 = filled(10, base + 100), c2 = filled(4, base + 200), s2 = filled(8, base + 300);
  s.save_layer(pos, 0, c0.data(), s0.data());
  if (!only_first) s.save_layer(pos, 2, c2.data(), s2.data());
}

void expect_state(const RecurrentState& s, float base) {
  EXPECT_EQ(std::vector<float>(s.conv(0), s.conv(0) + 6), filled(6, base));
  EXPECT_EQ(std::vector<float>(s.ssm(0), s.ssm(0) + 10), filled(10, base + 100));
  EXPECT_EQ(std::vector<float>(s.conv(2), s.conv(2) + 4), filled(4, base + 200));
  EXPECT_EQ(std::vector<float>(s.ssm(2), s.ssm(2) + 8), filled(8, base + 300));
}

TEST(RecurrentState, RestoreGivesTheStateSavedEvenInRecycledStorage) {
  RecurrentState s = make_state();
  s.set_snapshot_policy(16, 2);
  save_all(s, 16, 1.0f);
  EXPECT_EQ(s.restore(20), 16);
  expect_state(s, 1.0f);
  EXPECT_EQ(s.restore(0), 0);  // drops the snapshot at 16: its storage is kept for the next one
  EXPECT_TRUE(s.snapshot_positions().empty());
  save_all(s, 16, 50.0f);  // filled into that storage
  EXPECT_EQ(s.restore(16), 16);
  expect_state(s, 50.0f);
  // At most 2 kept: a third drops the oldest, whose storage the third then fills.
  save_all(s, 32, 70.0f);
  save_all(s, 48, 90.0f);
  EXPECT_EQ(s.snapshot_positions(), (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(s.restore(40), 32);
  expect_state(s, 70.0f);
}

TEST(RecurrentState, PartialSnapshotInRecycledStorageIsNotRestored) {
  RecurrentState s = make_state();
  s.set_snapshot_policy(16, 8);
  save_all(s, 16, 1.0f);
  save_all(s, 32, 5.0f);
  EXPECT_EQ(s.restore(20), 16);  // drops 32, whose storage held both layers
  save_all(s, 32, 9.0f, /*only_first=*/true);  // a batch that failed after its first layer's save
  EXPECT_EQ(s.restore(40), 16);  // 32 is partial: dropped, 16 restored
  expect_state(s, 1.0f);
}

}  // namespace
}  // namespace frink
