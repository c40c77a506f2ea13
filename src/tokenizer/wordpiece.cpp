// llama.cpp's llm_tokenizer_wpm_session. GGUF BERT vocabularies store word-initial pieces
// with a U+2581 prefix and continuation pieces bare (the converter rewrote HF's "##"), so
// each word gets the prefix and is matched greedily, longest piece first; a word with any
// unmatched position becomes one [UNK].
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/unicode.h"

namespace frink::tok {

namespace {

// BERT's _is_chinese_char ranges as llama.cpp has them (0x2B920, not 0x2B820, as HF's Rust).
bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::vector<std::string> preprocess(const Vocab& v, std::string_view text) {
  std::vector<uint32_t> cpts = decode_utf8(text);
  if (v.strip_accents)
    for (uint32_t& c : cpts) c = cpt_nfd_first(c);
  std::vector<std::string> words(1);
  for (uint32_t cpt : cpts) {
    const uint8_t f = cpt_flags(cpt);
    if (f & kWhitespace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cpt == 0 || cpt == 0xFFFD || (f & kControl)) continue;
    if (v.strip_accents && (f & kAccentMark)) continue;
    std::string s;
    append_utf8(s, v.lowercase ? cpt_to_lower(cpt) : cpt);
    if ((f & kPunctuation) || (cpt < 0x7F && (f & kSymbol)) || is_chinese_char(cpt)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = std::move(s);
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

}  // namespace

void wpm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  for (const std::string& word : preprocess(v, text)) {
    if (word.empty()) continue;
    const std::string w = "\xE2\x96\x81" + word;
    const int n = static_cast<int>(w.size());
    const size_t n_before = out.size();
    for (int i = 0; i < n; ++i) {
      bool match = false;
      for (int j = std::min(n, i + v.max_token_len + 1); j > i; --j) {
        const int32_t id = v.find(std::string_view(w).substr(i, j - i));
        if (id != kNoToken) {
          out.push_back(id);
          match = true;
          i = j - 1;
          break;
        }
      }
      if (!match) {  // discard the word's pieces
        out.resize(n_before);
        break;
      }
    }
    if (out.size() == n_before) out.push_back(v.unk);
  }
}

}  // namespace frink::tok
