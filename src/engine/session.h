// Session: one sequence's state. Its KvCache per attention layer and its RecurrentState for
// the recurrent layers of a hybrid model (host, authoritative), the tokens it has consumed,
// and the context size it was planned for. A device may hold a newer recurrent state than
// the host between steps; the RecurrentState pulls it on any host access (copying the
// session included), so a Session is still a plain value to everything above it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/recurrent_state.h"
#include "model/model.h"

namespace frink {

class Session {
 public:
  // n_ctx > 0 plans every cache for n_ctx rows; 0 lets them grow without bound.
  Session(const Model& m, int64_t n_ctx);

  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t n_ctx() const { return n_ctx_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  KvCache& cache(int64_t layer) { return caches_[static_cast<size_t>(layer)]; }

  RecurrentState& recurrent() { return recurrent_; }

  // Forgets everything after the first n tokens (n <= n_past()) and returns the position the
  // session is left at. Attention caches cut exactly, so that is n for attention-only models.
  // A recurrent state cannot be cut: it goes back to its nearest snapshot at or before n, the
  // session is left THERE (a log line says so when that is before n), and the tokens from the
  // returned position to n must be run again; rewind_session (engine/rewind.h) does both.
  int64_t truncate(int64_t n);
  // Records tokens the decoder has just run through every layer.
  void commit(const int32_t* tokens, int64_t n) { tokens_.insert(tokens_.end(), tokens, tokens + n); }

 private:
  int64_t n_ctx_;
  std::vector<KvCache> caches_;   // one per layer; a recurrent layer's stays empty
  RecurrentState recurrent_;
  std::vector<int32_t> tokens_;
};

}  // namespace frink
