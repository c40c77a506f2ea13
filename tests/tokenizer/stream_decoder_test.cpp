// StreamDecoder: pieces never split a UTF-8 character, even when SentencePiece byte fallback
// spells one character as several <0xNN> tokens.
#include <gtest/gtest.h>

#include "tokenizer/unicode.h"
#include "vocab_cases.h"

namespace frink::test {
namespace {

bool is_valid_utf8(const std::string& s) {
  for (uint32_t c : tok::decode_utf8(s))
    if (c == 0xFFFD) return false;
  return true;
}

TEST(StreamDecoder, ByteFallbackCharactersComeOutWhole) {
  FRINK_REQUIRE_SHARED();
  // stories260K has 512 tokens: nearly every non-ASCII character is byte fallback.
  const auto tok = load_gguf_tokenizer(shared_testdata() / "models/stories260K.gguf");
  const std::string text = "Ünïcödé 🦙 ok — 我想";
  const std::vector<int32_t> ids = tok->encode(text, false, false);
  int n_byte_tokens = 0;
  for (int32_t id : ids) n_byte_tokens += (tok->vocab().tokens[id].attr & tok::kAttrByte) != 0;
  ASSERT_GE(n_byte_tokens, 4) << "the text should need byte fallback in this vocabulary";

  StreamDecoder dec(*tok);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "piece splits a character at token " << id;
    all += piece;
  }
  all += dec.flush();
  EXPECT_EQ(all, " " + text);  // streaming keeps the prefix space; decode() drops it
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(StreamDecoder, IncompleteTailIsHeldAndFlushed) {
  EXPECT_EQ(tok::complete_utf8_prefix("ab\xF0\x9F"), 2u);
  EXPECT_EQ(tok::complete_utf8_prefix("ab\xF0\x9F\xA6\x99"), 6u);
  EXPECT_EQ(tok::complete_utf8_prefix("\xC3"), 0u);
  EXPECT_EQ(tok::complete_utf8_prefix("\x80\x80"), 2u);  // stray continuation bytes pass
  EXPECT_EQ(tok::complete_utf8_prefix(""), 0u);
}

}  // namespace
}  // namespace frink::test
