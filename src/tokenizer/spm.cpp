// llama.cpp's llm_tokenizer_spm_session, which reproduces SentencePiece's BPE mode: symbols
// start as single UTF-8 characters; a max-heap of adjacent pairs, keyed by the score of the
// token their concatenation spells (ties: the left-most pair), merges until no pair is a
// token; each final symbol that is not a token is re-split along the merges that built it
// (rev_merge), and what still is not a token is emitted as <0xNN> byte tokens.
#include <unordered_map>
#include <queue>
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/unicode.h"

namespace frink::tok {

namespace {

struct Bigram {
  int left, right;
  float score;
  size_t size;
};

struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

class SpmSession {
 public:
  explicit SpmSession(const Vocab& v) : v_(v) {}

  void tokenize(std::string_view text, std::vector<int32_t>& out) {
    size_t offs = 0;
    int index = 0;
    while (offs < text.size()) {
      const size_t n = std::min(utf8_len(text[offs]), text.size() - offs);
      symbols_.push_back({index - 1, offs + n == text.size() ? -1 : index + 1, text.data() + offs, n});
      offs += n;
      ++index;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[b.left];
      Symbol& r = symbols_[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = b.left;
      try_add_bigram(l.prev, b.left);
      try_add_bigram(b.left, l.next);
    }
    for (int i = 0; i != -1 && !symbols_.empty(); i = symbols_[i].next) resegment(symbols_[i], out);
  }

 private:
  void resegment(const Symbol& s, std::vector<int32_t>& out) {
    const std::string_view text(s.text, s.n);
    const int32_t id = v_.find(text);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge_.find(std::string(text));
    if (it == rev_merge_.end()) {
      for (char c : text) {
        const int32_t b = v_.byte_to_token(static_cast<uint8_t>(c));
        out.push_back(b != kNoToken ? b : v_.unk);
      }
      return;
    }
    resegment(symbols_[it->second.first], out);
    resegment(symbols_[it->second.second], out);
  }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view text(symbols_[left].text, symbols_[left].n + symbols_[right].n);
    const int32_t id = v_.find(text);
    if (id == kNoToken) return;
    queue_.push({left, right, v_.tokens[id].score, text.size()});
    rev_merge_[std::string(text)] = {left, right};
  }

  const Vocab& v_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue_;
  std::unordered_map<std::string, std::pair<int, int>> rev_merge_;
};

}  // namespace

void spm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  SpmSession(v).tokenize(text, out);
}

}  // namespace frink::tok
