// Tokenizers of real model files, special-token handling and end-of-generation ids.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "vocab_cases.h"

namespace frink::test {
namespace {

using Ids = std::vector<int32_t>;

TEST(ModelVocab, Stories260KOnceUponATime) {
  FRINK_REQUIRE_SHARED();
  const auto tok = load_gguf_tokenizer(shared_testdata() / "models/stories260K.gguf");
  EXPECT_EQ(tok->n_vocab(), 512);
  // llama.cpp's ids for this prompt (testdata/expected/..._OnceUponATime_n120.txt).
  EXPECT_EQ(tok->encode("Once upon a time", true, true), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->decode({1, 403, 407, 261, 378}, /*render_special=*/false), " Once upon a time");
  EXPECT_EQ(tok->decode({403, 407, 261, 378}), "Once upon a time");
}

TEST(ModelVocab, Llama2TinyHelloWorld) {
  FRINK_REQUIRE_SHARED();
  const auto tok = load_gguf_tokenizer(shared_testdata() / "models/llama-2-tiny-random.gguf");
  EXPECT_EQ(tok->n_vocab(), 32000);
  EXPECT_EQ(tok->encode("Hello world", true, true), (Ids{1, 15043, 3186}));
  EXPECT_EQ(tok->encode("Hello world", false, true), (Ids{15043, 3186}));
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_FALSE(tok->is_eog(15043));
}

TEST(ModelVocab, ParseSpecialCutsControlTokensOnlyWhenAsked) {
  FRINK_REQUIRE_SHARED();
  const auto tok = load_gguf_tokenizer(shared_testdata() / "vocab/ggml-vocab-llama-spm.gguf");
  const Ids with = tok->encode("Hello</s>world", false, true);
  ASSERT_EQ(with.size(), 3u);
  EXPECT_EQ(with[1], 2);  // </s>
  // After a special token the next fragment gets the SentencePiece prefix space again.
  EXPECT_EQ(with[2], tok->encode("world", false, false)[0]);
  const Ids without = tok->encode("Hello</s>world", false, false);
  EXPECT_EQ(std::count(without.begin(), without.end(), 2), 0);
  EXPECT_GT(without.size(), 3u);
  EXPECT_EQ(tok->decode(without), "Hello</s>world");
  // Rendering: control tokens print only when asked.
  EXPECT_EQ(tok->token_to_piece(2, true), "</s>");
  EXPECT_EQ(tok->token_to_piece(2, false), "");
}

TEST(ModelVocab, Gpt2EndOfTextIsEogAndParsed) {
  FRINK_REQUIRE_SHARED();
  const auto tok = load_gguf_tokenizer(shared_testdata() / "vocab/ggml-vocab-gpt-2.gguf");
  const int32_t eot = tok->vocab().find("<|endoftext|>");
  ASSERT_NE(eot, tok::kNoToken);
  EXPECT_TRUE(tok->is_eog(eot));
  const Ids ids = tok->encode("a<|endoftext|>b", false, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 1);
  const Ids raw = tok->encode("a<|endoftext|>b", false, false);
  EXPECT_EQ(std::count(raw.begin(), raw.end(), eot), 0);
}

TEST(ModelVocab, BertAddsClsAndSep) {
  FRINK_REQUIRE_SHARED();
  const auto tok = load_gguf_tokenizer(shared_testdata() / "vocab/ggml-vocab-bert-bge.gguf");
  const Ids ids = tok->encode("Hello world", true, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), tok->bos());
  EXPECT_EQ(ids.back(), tok->vocab().sep);
  EXPECT_EQ(tok->decode(Ids(ids.begin() + 1, ids.end() - 1)), " hello world");
}

TEST(ModelVocab, UnknownPreTokenizerIsAnError) {
  Metadata m;
  m.set("tokenizer.ggml.model", MetaValue::of_string("gpt2"));
  m.set("tokenizer.ggml.pre", MetaValue::of_string("no-such-pre"));
  EXPECT_THROW(Tokenizer::from_gguf(m), Error);
  Metadata n;
  n.set("tokenizer.ggml.model", MetaValue::of_string("llama"));
  EXPECT_THROW(Tokenizer::from_gguf(n), Error);  // no token list
}

}  // namespace
}  // namespace frink::test
