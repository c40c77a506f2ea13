#include "engine/session.h"

#include "core/error.h"

namespace frink {

Session::Session(const Model& m, int64_t n_ctx) : n_ctx_(n_ctx) {
  caches_.reserve(m.hp.layers.size());
  for (const LayerPlan& p : m.hp.layers)
    caches_.emplace_back(p.n_head_kv * p.head_dim_k, p.n_head_kv * p.head_dim_v, n_ctx);
}

void Session::truncate(int64_t n) {
  FRINK_ASSERT(n >= 0 && n <= n_past());
  for (auto& c : caches_) c.truncate(n);
  tokens_.resize(static_cast<size_t>(n));
}

}  // namespace frink
