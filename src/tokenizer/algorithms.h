// The three tokenizing algorithms, each run on one piece of raw text that special-token
// partitioning left (encode.cpp). Each appends ids to `out` and reads only the vocabulary,
// so one Vocab serves any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace frink::tok {

// One symbol of the merge loops spm_tokenize and bpe_tokenize share (llama.cpp's
// llm_symbol): a span of the text being split, in a doubly linked list of its symbols.
// A merge grows the left symbol and empties the right one (n == 0).
struct Symbol {
  int prev, next;      // neighbours' indices, -1 at either end
  const char* text;    // into the text being tokenized
  size_t n;            // bytes
};

// SentencePiece BPE (llama.cpp llm_tokenizer_spm_session): `text` already has spaces
// escaped to U+2581; merges the adjacent pair whose merged text is the highest-scoring token,
// leftmost first on ties; leftover pieces fall back to <0xNN> byte tokens.
void spm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

// Byte-level BPE (llm_tokenizer_bpe_session): pre-tokenize, then per pre-token merge the
// pair with the lowest merge rank, leftmost first on ties.
void bpe_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

// WordPiece (llm_tokenizer_wpm_session): normalise (lowercase, strip accents), split on
// whitespace and punctuation, then greedy longest match with a U+2581 word-start marker.
void wpm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

}  // namespace frink::tok
