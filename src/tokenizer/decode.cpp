// Tokenizer::decode and token_to_piece: llama.cpp's llama_vocab::impl::detokenize and
// token_to_piece over the piece cache built in finish_vocab().
#include "tokenizer/tokenizer.h"

namespace frink {

namespace {

// llama.cpp's clean_up_tokenization_spaces passes (detokenize): " ?" " !" " ." " ," lose
// the space; " ' " loses both; " 's" " 'm" " 're" " 've" lose the space (" 't" " 'd" " 'll"
// keep it, as there).
std::string clean_spaces(std::string text) {
  // A literal port of the in-place passes: later reads see earlier writes, as there.
  int total = static_cast<int>(text.size());
  const int total1 = total;
  total = total ? 1 : 0;
  for (int i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  }
  const int total2 = total;
  total = total ? 1 : 0;
  for (int i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  const int total3 = total;
  total = total ? 1 : 0;
  for (int i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  }
  text.resize(total);
  return text;
}

}  // namespace

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < v_.n_tokens() && (v_.tokens[id].attr & tok::kAttrControl);
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (id < 0 || id >= v_.n_tokens()) return "";
  if (!render_special && (v_.tokens[id].attr & (tok::kAttrUnknown | tok::kAttrControl))) return "";
  return v_.pieces[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  bool remove_space = v_.add_space_prefix;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, render_special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  return v_.clean_spaces ? clean_spaces(out) : out;
}

}  // namespace frink
