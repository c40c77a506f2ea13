// UTF-8 and codepoint helpers the tokenizers share: llama.cpp's lenient UTF-8 decoding (a bad
// byte becomes U+FFFD and decoding goes on), GPT-2's byte <-> printable-codepoint map, and
// the codepoint classes WordPiece normalisation needs (tables generated from Python's
// unicodedata by gen_unicode_tables.py, the same source llama.cpp's tables come from).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace frink::tok {

// Bits of a codepoint's class; one of the category bits, plus kWhitespace.
enum CptFlags : uint8_t {
  kNumber = 1, kLetter = 2, kSeparator = 4, kAccentMark = 8, kPunctuation = 16, kSymbol = 32,
  kControl = 64, kWhitespace = 128,
};

struct CptRange { uint32_t first; uint8_t flags; };
struct CptPair { uint32_t cpt; uint32_t mapped; };

// Bytes in the UTF-8 sequence that lead byte `c` starts (1 for a stray continuation byte,
// as llama.cpp's unicode_len_utf8 does).
inline size_t utf8_len(char c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[static_cast<uint8_t>(c) >> 4];
}

// llama.cpp's unicode_cpts_from_utf8: invalid sequences give U+FFFD and skip ONE byte.
std::vector<uint32_t> decode_utf8(std::string_view s);
void append_utf8(std::string& out, uint32_t cpt);

uint8_t cpt_flags(uint32_t cpt);
uint32_t cpt_to_lower(uint32_t cpt);
uint32_t cpt_nfd_first(uint32_t cpt);  // first codepoint of the canonical decomposition

// GPT-2's bytes_to_unicode(): byte b <-> one printable codepoint, as UTF-8 text.
const std::string& byte_to_unicode(uint8_t b);
// The byte a GPT-2 codepoint stands for, or -1 when `cpt` is not one of the 256.
int unicode_to_byte(uint32_t cpt);

// Length of the longest prefix of `s` that holds no incomplete trailing UTF-8 sequence: a
// final lead byte still waiting for continuation bytes is left out; anything invalid is kept.
size_t complete_utf8_prefix(std::string_view s);

}  // namespace frink::tok
