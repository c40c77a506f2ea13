// Rewinding a session to an earlier position, whatever its layers are. Attention caches cut
// exactly; a recurrent state goes back to its nearest snapshot (Session::truncate) and the
// tokens from there are run again here, so the session ends at exactly n either way.
#pragma once

#include <cstdint>

#include "engine/decoder.h"
#include "engine/session.h"

namespace frink {

// Leaves s holding its first n tokens (n <= s.n_past()). Returns how many tokens had to be
// run again (0 when a snapshot or the caches allowed an exact cut).
int64_t rewind_session(Decoder& dec, Session& s, int64_t n);

}  // namespace frink
