// Names read from a file go into one-line error messages: printable() keeps them one line
// and short whatever bytes the file holds.
#pragma once

#include <string>
#include <string_view>

namespace frink {

// At most `max_chars` characters; control and non-ASCII bytes as \xNN; quoted.
std::string printable(std::string_view s, size_t max_chars = 80);

}  // namespace frink
