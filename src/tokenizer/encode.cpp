// Tokenizer::encode: llama.cpp's llama_vocab::impl::tokenize. Special tokens are cut out of
// the text first (tokenizer_st_partition: longest token text first, each over every raw
// fragment left), then each raw fragment goes through the vocabulary's algorithm.
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/tokenizer.h"

namespace frink {

namespace {

using tok::Vocab;

// A token id, or raw text [begin, end) of the input when token == kNoToken.
struct Fragment {
  int32_t token;
  size_t begin, end;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::vector<Fragment> partition(const Vocab& v, std::string_view text, bool parse_special) {
  std::vector<Fragment> frags{{tok::kNoToken, 0, text.size()}}, next;
  for (int32_t id : v.special_tokens) {
    const tok::TokenData& t = v.tokens[id];
    // Without parse_special only USER_DEFINED tokens are cut out (HF does the same:
    // tokenizers/src/tokenizer/mod.rs, added tokens are split before pre-tokenization).
    if (!parse_special && (t.attr & (tok::kAttrControl | tok::kAttrUnknown))) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != tok::kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.begin, end = f.end;
      while (begin < end) {
        const size_t match = text.substr(0, end).find(t.text, begin);
        if (match == std::string_view::npos) break;
        size_t left_end = match;
        if (t.attr & tok::kAttrLstrip)
          while (left_end > begin && is_space(text[left_end - 1])) --left_end;
        if (left_end > begin) next.push_back({tok::kNoToken, begin, left_end});
        next.push_back({id, 0, 0});
        begin = match + t.text.size();
        if (begin < end && (t.attr & tok::kAttrRstrip))
          while (begin < end && is_space(text[begin])) ++begin;
      }
      if (begin < end) next.push_back({tok::kNoToken, begin, end});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  std::vector<Fragment> frags;
  if (!text.empty()) frags = partition(v_, text, parse_special);
  const auto raw = [&](const Fragment& f) { return text.substr(f.begin, f.end - f.begin); };

  switch (v_.type) {
    case tok::VocabType::kSpm: {
      if (add_special && v_.add_bos) out.push_back(v_.bos);
      bool prev_special = true;  // the first raw fragment gets the prefix space
      for (const Fragment& f : frags) {
        if (f.token != tok::kNoToken) {
          out.push_back(f.token);
          prev_special = true;
          continue;
        }
        std::string s = (v_.add_space_prefix && prev_special) ? " " : "";
        s += raw(f);
        std::string escaped;
        escaped.reserve(s.size() * 2);
        for (char c : s) escaped += c == ' ' ? std::string_view("\xE2\x96\x81") : std::string_view(&c, 1);
        tok::spm_tokenize(v_, escaped, out);
        prev_special = false;
      }
      if (add_special && v_.add_eos) out.push_back(v_.eos);
      break;
    }
    case tok::VocabType::kBpe: {
      if (add_special && v_.add_bos) out.push_back(v_.bos);
      for (const Fragment& f : frags) {
        if (f.token != tok::kNoToken) {
          out.push_back(f.token);
          continue;
        }
        if (!v_.escape_whitespaces) {
          tok::bpe_tokenize(v_, raw(f), out);
          continue;
        }
        std::string escaped;
        for (char c : raw(f)) escaped += c == ' ' ? std::string_view("\xE2\x96\x81") : std::string_view(&c, 1);
        tok::bpe_tokenize(v_, escaped, out);
      }
      if (add_special && v_.add_eos) out.push_back(v_.eos);
      break;
    }
    case tok::VocabType::kWpm: {
      if (add_special) out.push_back(v_.bos);
      for (const Fragment& f : frags) {
        if (f.token != tok::kNoToken) out.push_back(f.token);
        else tok::wpm_tokenize(v_, raw(f), out);
      }
      if (add_special) out.push_back(v_.sep);
      break;
    }
  }
  return out;
}

}  // namespace frink
