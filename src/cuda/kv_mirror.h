// KvMirror: the device copy of ONE host KvCache (one attention layer of one sequence),
// DESIGN.md section 3.
//
// Authority: the host KvCache is the truth. The mirror holds K and V rows [0, seq_len) in
// f32, exactly the host's floats; the device work that computes a new token's K/V writes
// them into the mirror AND copies them back to the host cache, so the host stays complete
// and nothing else in the engine needs to know a mirror exists.
//
// Staleness: the mirror is trusted ONLY while (seq_len, epoch) == (cache.rows(),
// cache.epoch()) and the fingerprint of the cache's last K row (its first kFingerprintFloats)
// is the one recorded when the mirror last caught up. Anything else (a truncate, a rewind, a
// prefix-cache restore, a slot load, rows the host appended while this layer refused, a
// different cache that came to live at the same address) and prepare() re-uploads the whole
// history. One upload is cheaper than enumerating every path that can rewind a cache, and
// that enumeration is what would rot. The fingerprint covers what (rows, epoch) cannot: a
// cache restored from a copy whose counters happen to agree.
//
// Capacity: the cache's planned capacity when it has one; otherwise the next power of two
// of the needed length, at least 512, grown by doubling. A growth re-uploads (the staleness
// rule would do it anyway); a mirror that refused an unbounded cache would never fire.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kv/kv_cache.h"

namespace frink::cuda {

class KvMirror {
 public:
  KvMirror(int64_t k_width, int64_t v_width) : k_width_(k_width), v_width_(v_width) {}
  ~KvMirror();
  KvMirror(const KvMirror&) = delete;
  KvMirror& operator=(const KvMirror&) = delete;

  // Before device work appends n_new rows at cache.rows(): makes room (growing by the
  // capacity rule) and, when stale, re-uploads rows [0, cache.rows()) from the host.
  // trust_stale is the tests' SABOTAGE switch: a stale mirror is then used as it is.
  void prepare(const KvCache& cache, int64_t n_new, cudaStream_t stream, bool trust_stale);
  // After the new rows reached the host cache: the mirror is current again.
  void caught_up(const KvCache& cache);
  // The staleness rule above: whether the mirror holds exactly the cache's rows.
  bool current(const KvCache& cache) const;
  // Device bytes prepare(cache, n_new) would allocate (0: no growth), and bytes held now.
  size_t growth_bytes(const KvCache& cache, int64_t n_new) const;
  size_t bytes() const { return static_cast<size_t>(capacity_ * (k_width_ + v_width_)) * sizeof(float); }

  float* k_rows(int64_t row) { return k_ + row * k_width_; }
  float* v_rows(int64_t row) { return v_ + row * v_width_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t k_width() const { return k_width_; }
  int64_t v_width() const { return v_width_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_uploads() const { return n_uploads_; }  // full re-uploads so far (tests)

 private:
  static constexpr int64_t kFingerprintFloats = 64;
  static uint64_t fingerprint(const KvCache& cache);

  int64_t k_width_, v_width_;
  float* k_ = nullptr;  // [capacity][k_width] on the device
  float* v_ = nullptr;  // [capacity][v_width]
  int64_t capacity_ = 0;
  int64_t seq_len_ = -1;  // -1: holds nothing trustworthy
  uint64_t epoch_ = 0, fingerprint_ = 0;
  int64_t n_uploads_ = 0;
};

// The capacity rule, alone so tests can state it: planned capacity when it covers `need`,
// else the next power of two >= need, at least 512.
int64_t mirror_capacity_for(int64_t need, int64_t planned);

}  // namespace frink::cuda
