// KvCache: rows read back as appended, whatever storage ready_rows made resident ahead.
#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace frink {
namespace {

std::vector<float> row_of(int64_t r, int64_t width, float base) {
  std::vector<float> v(static_cast<size_t>(width));
  for (int64_t i = 0; i < width; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(r * width + i);
  return v;
}

void expect_rows(const KvCache& c, int64_t n) {
  ASSERT_EQ(c.rows(), n);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(std::vector<float>(c.k(r), c.k(r) + c.k_width()), row_of(r, c.k_width(), 0.0f)) << "k row " << r;
    if (c.v_width() > 0) {
      EXPECT_EQ(std::vector<float>(c.v(r), c.v(r) + c.v_width()), row_of(r, c.v_width(), 0.5f)) << "v row " << r;
    }
  }
}

void append_rows(KvCache& c, int64_t from, int64_t to) {
  for (int64_t r = from; r < to; ++r) {
    const auto k = row_of(r, c.k_width(), 0.0f), v = row_of(r, c.v_width(), 0.5f);
    c.append(k.data(), c.v_width() > 0 ? v.data() : nullptr);
  }
}

// A decode loop: rows readied one step ahead, then appended; a truncate in the middle (the
// readied storage past it must not leak into rows appended after).
TEST(KvCache, ReadiedRowsReadBackAsAppended) {
  for (int64_t planned : {int64_t{0}, int64_t{40}}) {
    KvCache c(24, 8, planned);
    for (int64_t r = 0; r < 20; ++r) {
      c.ready_rows(r % 3 + 1);  // one to three rows ahead
      EXPECT_EQ(c.rows(), r) << "ready_rows adds no rows";
      append_rows(c, r, r + 1);
    }
    expect_rows(c, 20);
    c.ready_rows(7);
    c.truncate(11);
    expect_rows(c, 11);
    append_rows(c, 11, 30);
    expect_rows(c, 30);
  }
}

TEST(KvCache, ReadyRowsStopsAtThePlannedCapacity) {
  KvCache c(4, 4, 3);
  c.ready_rows(100);
  append_rows(c, 0, 3);
  expect_rows(c, 3);
  const auto k = row_of(3, 4, 0.0f), v = row_of(3, 4, 0.5f);
  EXPECT_THROW(c.append(k.data(), v.data()), Error);
  expect_rows(c, 3);
}

// A batch's rows in one call (the device backend lands a prompt batch so): they read back as
// rows appended one by one would, and a batch that overflows the planned capacity leaves the
// cache as it was, not part-filled.
TEST(KvCache, BatchOfRowsAppendsWholeOrNotAtAll) {
  KvCache c(6, 2, 10);
  append_rows(c, 0, 3);
  std::vector<float> k, v;
  for (int64_t r = 3; r < 8; ++r) {
    const auto kr = row_of(r, 6, 0.0f), vr = row_of(r, 2, 0.5f);
    k.insert(k.end(), kr.begin(), kr.end());
    v.insert(v.end(), vr.begin(), vr.end());
  }
  c.append_rows(k.data(), v.data(), 5);
  expect_rows(c, 8);
  EXPECT_THROW(c.append_rows(k.data(), v.data(), 3), Error);  // 11 rows of 10
  expect_rows(c, 8);
  c.append_rows(k.data(), v.data(), 0);
  expect_rows(c, 8);
}

TEST(KvCache, SharedRowsWithoutV) {
  KvCache c(16, 0, 0);
  c.ready_rows(5);
  append_rows(c, 0, 9);
  expect_rows(c, 9);
  EXPECT_EQ(c.v(4), c.k(4));
}

}  // namespace
}  // namespace frink
