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

void KvCache::append(const float* k_row, const float* v_row) {
  if (planned_capacity_ > 0 && rows_ >= planned_capacity_)
    fail("the context is full ({} tokens); start a new conversation or raise -c", planned_capacity_);
  k_.insert(k_.end(), k_row, k_row + k_width_);
  if (v_width_ > 0) v_.insert(v_.end(), v_row, v_row + v_width_);
  ++rows_;
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
