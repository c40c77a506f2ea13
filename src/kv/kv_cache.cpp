#include "kv/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace frink {

KvCache::KvCache(int64_t k_width, int64_t v_width, int64_t planned_capacity)
    : k_width_(k_width), v_width_(v_width), planned_capacity_(planned_capacity) {
  FRINK_ASSERT(k_width > 0 && v_width >= 0 && planned_capacity >= 0);
  if (planned_capacity_ > 0) {
    k_.reserve(static_cast<size_t>(planned_capacity_ * k_width_));
    v_.reserve(static_cast<size_t>(planned_capacity_ * v_width_));
  }
}

void KvCache::append_rows(const float* k_rows, const float* v_rows, int64_t n) {
  FRINK_ASSERT(n >= 0);
  if (planned_capacity_ > 0 && rows_ + n > planned_capacity_)
    fail("the context is full ({} tokens); start a new conversation or raise -c", planned_capacity_);
  // One resize and one copy for a prompt batch's rows: a device batch lands them all at once.
  const auto put = [this, n](std::vector<float>& dst, const float* rows, int64_t width) {
    const size_t at = static_cast<size_t>(rows_ * width), len = static_cast<size_t>(n * width);
    if (dst.size() < at + len) dst.resize(at + len);
    std::copy(rows, rows + len, dst.begin() + static_cast<std::ptrdiff_t>(at));
  };
  put(k_, k_rows, k_width_);
  if (v_width_ > 0) put(v_, v_rows, v_width_);
  rows_ += n;
}

void KvCache::ready_rows(int64_t n) {
  int64_t want = rows_ + n;
  if (planned_capacity_ > 0) want = std::min(want, planned_capacity_);
  if (static_cast<int64_t>(k_.size()) < want * k_width_) k_.resize(static_cast<size_t>(want * k_width_));
  if (v_width_ > 0 && static_cast<int64_t>(v_.size()) < want * v_width_) v_.resize(static_cast<size_t>(want * v_width_));
}

void KvCache::truncate(int64_t n) {
  FRINK_ASSERT(n >= 0 && n <= rows_, "truncate to {} of {} rows", n, rows_);
  if (n == rows_) return;
  rows_ = n;
  k_.resize(static_cast<size_t>(n * k_width_));
  v_.resize(static_cast<size_t>(n * v_width_));
  ++epoch_;
}

}  // namespace frink
