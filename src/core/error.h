// Three outcomes, three channels (see STYLE.md):
//  - bad input (a corrupt file, an unknown architecture, a bad request): throw frink::Error
//    with ONE line that names the thing and what is wrong with it. Only main() and the
//    server's request handler catch it; main prints "error: <line>" and exits 1.
//  - a bug (a broken invariant): FRINK_ASSERT, which aborts with file:line.
//  - a device refusal: a Refusal value (src/engine), never an exception.
// Exceptions rather than status returns because the parsers check hundreds of fields, and a
// check that can't be forgotten to propagate is worth more than the explicit plumbing.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace frink {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void assert_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace frink

#define FRINK_ASSERT(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::frink::assert_failed(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)
