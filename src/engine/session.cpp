#include "engine/session.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "cpu/recurrent_layer.h"

namespace frink {

Session::Session(const Model& m, int64_t n_ctx) : n_ctx_(n_ctx) {
  caches_.reserve(m.hp.layers.size());
  std::vector<RecurrentState::LayerShape> shapes;
  for (const LayerPlan& p : m.hp.layers) {
    if (p.recurrent != RecurrentKind::kNone) {
      caches_.emplace_back(1, 1, 0);  // never appended: the layer keeps no K/V
      shapes.push_back(cpu::recurrent_state_shape(p));
      continue;
    }
    caches_.emplace_back(p.cache_k_width(), p.cache_v_width(), n_ctx);
    shapes.push_back({});
  }
  recurrent_ = RecurrentState(std::move(shapes));
}

int64_t Session::truncate(int64_t n) {
  FRINK_ASSERT(n >= 0 && n <= n_past());
  int64_t keep = n;
  if (!recurrent_.empty() && n < n_past()) {
    keep = recurrent_.restore(n);
    if (keep < n) FRINK_LOG_INFO("recurrent state: no snapshot at {}; rewound to {}, {} tokens to run again", n, keep, n - keep);
  }
  for (auto& c : caches_) c.truncate(std::min(keep, c.rows()));
  tokens_.resize(static_cast<size_t>(keep));
  return keep;
}

}  // namespace frink
