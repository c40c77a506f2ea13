// frink's tokenizer: text <-> token ids with llama.cpp's exact semantics (llama-vocab.cpp),
// for SentencePiece ("llama"), byte-level BPE ("gpt2", "gemma4") and WordPiece ("bert")
// vocabularies, loaded from GGUF metadata, a Hugging Face tokenizer.json, or GPT-2 style
// encoder.json + vocab.bpe files. A Tokenizer is immutable once built: encode and decode are
// const and safe from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace frink {

class Metadata;

class Tokenizer {
 public:
  // From tokenizer.ggml.* keys. Throws frink::Error on a missing or malformed key, an unknown
  // tokenizer model or pre-tokenizer.
  static std::unique_ptr<Tokenizer> from_gguf(const Metadata& meta);
  // From the text of a Hugging Face tokenizer.json (BPE "model" with a ByteLevel or Metaspace
  // pre-tokenizer, or WordPiece). `pre` names the llama.cpp pre-tokenizer to use for BPE
  // ("" = guess from the json: "llama3" for Llama-3 style regexes, "gpt-2" otherwise).
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& tokenizer_json_text,
                                                 std::string_view pre = "");
  // From GPT-2 style files: encoder.json (byte-level token text -> id) and vocab.bpe (merges,
  // one per line, after a "#version" line), with the llama.cpp pre-tokenizer `pre`.
  static std::unique_ptr<Tokenizer> from_gpt2_files(const std::string& encoder_json_text,
                                                    const std::string& vocab_bpe_text,
                                                    std::string_view pre);

  explicit Tokenizer(tok::Vocab vocab) : v_(std::move(vocab)) {}

  // llama_tokenize: `add_special` adds what the vocabulary asks for (BOS if add_bos, EOS if
  // add_eos; WordPiece: [CLS] ... [SEP]). `parse_special` lets CONTROL tokens written in the
  // text ("<|eot_id|>") become their ids; USER_DEFINED tokens always do.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // llama_detokenize(remove_special = false, unparse_special = render_special): concatenated
  // pieces, the SentencePiece prefix space dropped, clean_up_tokenization_spaces applied when
  // the vocabulary asks for it.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = true) const;

  // The bytes token `id` stands for (possibly part of a UTF-8 character). CONTROL and UNKNOWN
  // tokens give their text only when render_special. Out-of-range ids give "".
  std::string token_to_piece(int32_t id, bool render_special = true) const;
  const std::string& token_text(int32_t id) const { return v_.tokens.at(id).text; }

  bool is_eog(int32_t id) const { return id != tok::kNoToken && v_.eog_ids.count(id) > 0; }
  bool is_control(int32_t id) const;
  int32_t bos() const { return v_.bos; }
  int32_t eos() const { return v_.eos; }
  int32_t eot() const { return v_.eot; }
  int32_t eom() const { return v_.eom; }
  int32_t unk() const { return v_.unk; }
  int32_t pad() const { return v_.pad; }
  bool add_bos() const { return v_.add_bos; }
  int32_t n_vocab() const { return v_.n_tokens(); }
  const tok::Vocab& vocab() const { return v_; }

 private:
  tok::Vocab v_;
};

// Turns a stream of token ids into text pieces that never split a UTF-8 character: bytes of
// an incomplete trailing character are held back until the tokens completing it arrive
// (SentencePiece byte fallback spells one character as several <0xNN> tokens). Invalid bytes
// are passed through, never held forever.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = true)
      : tok_(tok), render_special_(render_special) {}
  // Text that became complete with token `id` (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the end of the stream).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace frink
