// KvCache: the keys and values of ONE attention layer of ONE sequence, on the host.
//
// Authority: this host copy is the truth. Truncation, the prefix cache, slot files and
// every host reader use it; nothing here knows that a device exists. A device keeps a
// MIRROR (src/cuda) that it trusts only while mirror.seq_len == rows(); anything that moves
// this cache backwards leaves the two disagreeing, and the device re-uploads. To make that
// rule hold even when a truncate is followed by host appends back to the same length,
// every truncate bumps epoch(): a mirror records (rows, epoch) and is stale when either
// differs.
//
// Rows are post-RoPE keys and values, exactly what attention reads: row r holds
// [n_head_kv * head_dim] floats for the token at position r.
//
// v_width 0 means there is no separate V row: V is read from the K row (v(r) == k(r)).
// Multi-head latent attention stores one compressed row per token this way
// (LayerPlan::cache_k_width / cache_v_width).
#pragma once

#include <cstdint>
#include <vector>

namespace frink {

class KvCache {
 public:
  // planned_capacity > 0 bounds the rows (the context size) and reserves it up front;
  // 0 means unbounded growth.
  KvCache(int64_t k_width, int64_t v_width, int64_t planned_capacity);

  int64_t rows() const { return rows_; }
  int64_t k_width() const { return k_width_; }
  int64_t v_width() const { return v_width_; }
  int64_t planned_capacity() const { return planned_capacity_; }
  uint64_t epoch() const { return epoch_; }

  // Appends n tokens' K and V rows: n rows of k_width, then (v_rows null when v_width is 0) n
  // of v_width. Throws frink::Error when they do not fit the planned capacity (the context is
  // exhausted), leaving the cache unchanged.
  void append_rows(const float* k_rows, const float* v_rows, int64_t n);
  void append(const float* k_row, const float* v_row) { append_rows(k_row, v_row, 1); }
  // Keeps the first n rows (n <= rows()).
  void truncate(int64_t n);
  // Makes the storage of the next n rows (up to the planned capacity) resident now, so their
  // appends later write to pages already touched. Why: a decode step appends one row per
  // layer, each onto fresh pages: an 8B model's 64 page faults were ~70 us of every token on
  // the H200 host, taken while the GPU waited; the device backend calls this while its step runs.
  void ready_rows(int64_t n);

  const float* k(int64_t row) const { return k_.data() + row * k_width_; }
  const float* v(int64_t row) const { return v_width_ ? v_.data() + row * v_width_ : k(row); }

 private:
  int64_t k_width_, v_width_, planned_capacity_;
  int64_t rows_ = 0;
  uint64_t epoch_ = 0;
  // Rows [0, rows_) are the cache; storage past them (ready_rows) holds nothing yet.
  std::vector<float> k_, v_;
};

}  // namespace frink
