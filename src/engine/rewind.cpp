#include "engine/rewind.h"

#include <vector>

#include "core/error.h"

namespace frink {

int64_t rewind_session(Decoder& dec, Session& s, int64_t n) {
  FRINK_ASSERT(n >= 0 && n <= s.n_past(), "rewind to {} of {} tokens", n, s.n_past());
  const std::vector<int32_t> tokens(s.tokens().begin(), s.tokens().begin() + n);
  const int64_t at = s.truncate(n);
  if (at == n) return 0;
  std::vector<float> unused;
  const std::vector<int32_t> replay(tokens.begin() + at, tokens.end());
  dec.eval(s, replay, false, unused);
  return n - at;
}

}  // namespace frink
