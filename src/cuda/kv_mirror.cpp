#include "cuda/kv_mirror.h"

#include <algorithm>
#include <bit>
#include <cstring>

// Header-only: the hash inlines, no library to link or carry to the GPU machine.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_check.h"

namespace frink::cuda {

int64_t mirror_capacity_for(int64_t need, int64_t planned) {
  if (planned >= need) return planned;
  return std::max<int64_t>(512, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(need))));
}

KvMirror::~KvMirror() {
  // Errors are not thrown from a destructor; a failed free at exit changes nothing.
  cudaFree(k_);
  cudaFree(v_);
}

uint64_t KvMirror::fingerprint(const KvCache& cache) {
  if (cache.rows() == 0) return 0;
  // XXH3 over the first kFingerprintFloats of the last K row: another sequence's row (another
  // token or history: a K row is a projection of the whole context) differs there too. It
  // runs twice per attention layer per decode step (prepare, caught_up), with the device idle:
  // a byte-at-a-time FNV-1a over an 8B layer's 4 KiB row was ~5 us, 0.3 ms of host time per
  // token (H200, `frink bench -v`). XXH3 over the whole row, then this prefix (with x's upload
  // through pinned memory, run_token): 8B Q4_0 host time a step 1.934-1.939 -> 1.906-1.920
  // ms, its landing after the replay 0.020-0.022 -> 0.007-0.009 (H200, one call, alternating).
  const int64_t n = std::min<int64_t>(cache.k_width(), kFingerprintFloats);
  return XXH3_64bits(cache.k(cache.rows() - 1), static_cast<size_t>(n) * sizeof(float));
}

size_t KvMirror::growth_bytes(const KvCache& cache, int64_t n_new) const {
  const int64_t need = cache.rows() + n_new;
  if (need <= capacity_) return 0;
  return static_cast<size_t>(mirror_capacity_for(need, cache.planned_capacity()) * (k_width_ + v_width_)) *
         sizeof(float);
}

void KvMirror::prepare(const KvCache& cache, int64_t n_new, cudaStream_t stream, bool trust_stale) {
  FRINK_ASSERT(cache.k_width() == k_width_ && cache.v_width() == v_width_, "mirror of another shape");
  const int64_t rows = cache.rows(), need = rows + n_new;
  if (need > capacity_) {
    const int64_t cap = mirror_capacity_for(need, cache.planned_capacity());
    FRINK_CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier work may still read the old buffers
    // Empty first: if an allocation below fails (device memory exhausted), the mirror holds
    // nothing and says so, and the next prepare() allocates again instead of trusting null.
    capacity_ = 0;
    seq_len_ = -1;
    FRINK_CUDA_CHECK(cudaFree(k_));
    FRINK_CUDA_CHECK(cudaFree(v_));
    k_ = v_ = nullptr;
    FRINK_CUDA_CHECK(cudaMalloc(&k_, static_cast<size_t>(cap * k_width_) * sizeof(float)));
    FRINK_CUDA_CHECK(cudaMalloc(&v_, static_cast<size_t>(cap * v_width_) * sizeof(float)));
    capacity_ = cap;
    if (!trust_stale) seq_len_ = -1;  // the new buffers hold nothing
  }
  const bool stale = !current(cache);
  if (stale && !trust_stale && rows > 0) {
    // Rows are contiguous in the host cache: one copy each for K and V.
    FRINK_CUDA_CHECK(cudaMemcpyAsync(k_, cache.k(0), static_cast<size_t>(rows * k_width_) * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
    FRINK_CUDA_CHECK(cudaMemcpyAsync(v_, cache.v(0), static_cast<size_t>(rows * v_width_) * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
    ++n_uploads_;
  }
  if (stale) caught_up(cache);
}

bool KvMirror::current(const KvCache& cache) const {
  return seq_len_ == cache.rows() && epoch_ == cache.epoch() && fingerprint_ == fingerprint(cache);
}

void KvMirror::caught_up(const KvCache& cache) {
  seq_len_ = cache.rows();
  epoch_ = cache.epoch();
  fingerprint_ = fingerprint(cache);
}

}  // namespace frink::cuda
