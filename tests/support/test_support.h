// Helpers every test binary shares: where the third-party data lives, reading raw f32
// fixtures, the normalised error DESIGN.md section 6 uses for logits, and the error line a
// reader gives for broken bytes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace frink::test {

// ../shared/testdata, or empty when the checkout has no shared folder beside it.
std::filesystem::path shared_testdata();

// Skips the calling test with a message when ../shared is absent (GTEST_SKIP must run in the
// test body, so this is a macro).
#define FRINK_REQUIRE_SHARED()                                                    \
  do {                                                                            \
    if (::frink::test::shared_testdata().empty())                                 \
      GTEST_SKIP() << "../shared/testdata is absent; skipping a test that needs it"; \
  } while (0)

std::vector<float> read_f32_file(const std::filesystem::path& p);
std::string read_text_file(const std::filesystem::path& p);

// sum((a-b)^2) / sum(b^2), accumulated in double; b is the reference.
double nmse(const float* a, const float* b, size_t n);

// Reads `bytes` with read(data, n_bytes) and returns the line of the frink::Error it throws,
// or "" when it reads them cleanly. The reader sees an exactly sized heap copy, so a read
// past the end is an AddressSanitizer error rather than a read of spare capacity.
template <typename Read>
std::string error_of(const std::vector<uint8_t>& bytes, Read&& read) {
  std::vector<uint8_t> copy(bytes);
  try {
    read(copy.data(), copy.size());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Runs `frink ARGS` (the built binary), returning exit code and captured stdout/stderr.
struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};
CommandResult run_frink(const std::string& args);
// The same with `input` on the program's standard input.
CommandResult run_frink_with_input(const std::string& args, const std::string& input);

}  // namespace frink::test
