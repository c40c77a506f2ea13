// Tokenizer::from_hf_json on small hand-written tokenizer.json texts.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace frink {
namespace {

using Ids = std::vector<int32_t>;

TEST(HfJson, ByteLevelBpeMergesAndAddedTokens) {
  // "Ġ" is GPT-2's byte-level space. Merges: h e -> he, he l -> hel, l o -> lo, hel lo -> hello.
  const std::string json = R"({
    "added_tokens": [{"id": 12, "content": "<|endoftext|>", "special": true},
                     {"id": 13, "content": "<tool>", "special": false}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
    "model": {"type": "BPE",
      "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "he": 5, "hel": 6, "lo": 7, "hello": 8,
                "Ġh": 9, "Ġhello": 10, "w": 11},
      "merges": ["h e", "he l", "l o", "hel lo", "Ġ h", "Ġh e", "Ġhe l", "Ġhel lo"]}
  })";
  const auto tok = Tokenizer::from_hf_json(json);
  EXPECT_EQ(tok->n_vocab(), 14);
  EXPECT_EQ(tok->encode("hello", false, false), (Ids{8}));
  EXPECT_EQ(tok->encode("hello<tool>w", false, false), (Ids{8, 13, 11}));  // user-defined: always cut
  EXPECT_EQ(tok->encode("w<|endoftext|>", false, true), (Ids{11, 12}));
  EXPECT_TRUE(tok->is_eog(12));
  EXPECT_EQ(tok->token_to_piece(4), " ");
}

TEST(HfJson, WordPieceGetsWordStartMarkers) {
  const std::string json = R"({
    "normalizer": {"type": "BertNormalizer", "lowercase": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]",
      "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "play": 4, "##ing": 5, "!": 6}}
  })";
  const auto tok = Tokenizer::from_hf_json(json);
  EXPECT_EQ(tok->encode("Playing!", true, false), (Ids{2, 4, 5, 6, 3}));
  EXPECT_EQ(tok->encode("xyz", false, false), (Ids{1}));
}

TEST(HfJson, RejectsWhatItCannotRun) {
  EXPECT_THROW(Tokenizer::from_hf_json("{"), Error);
  EXPECT_THROW(Tokenizer::from_hf_json(R"({"model": {"type": "Unigram", "vocab": []}})"), Error);
}

}  // namespace
}  // namespace frink
