// llama.cpp's llm_tokenizer_bpe_session: per pre-token, symbols start as single UTF-8
// characters of the byte-encoded text; a min-heap of adjacent pairs keyed by merge rank (ties:
// left-most) merges until no pair has a rank. A final symbol that is not a token falls back
// to one token per byte (byte-level text, or <0xNN> for raw-UTF-8 vocabularies such as
// gemma4); bytes without a token are dropped, as llama.cpp drops them.
#include <queue>
#include <string>

#include "tokenizer/algorithms.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace frink::tok {

namespace {

struct Bigram {
  int left, right;
  int rank;
  size_t size;  // bytes of left + right when queued; a mismatch later means it is stale
};

struct BigramGreater {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

class BpeWord {
 public:
  explicit BpeWord(const Vocab& v) : v_(v) {}

  void tokenize(const std::string& word, std::vector<int32_t>& out) {
    symbols_.clear();
    if (v_.ignore_merges && v_.find(word) != kNoToken) {
      out.push_back(v_.find(word));
      return;
    }
    // gemma4: a newline-only piece that is a token stays whole (llama.cpp PR #21343).
    if (v_.pre_name == "gemma4" && word.find_first_not_of('\n') == std::string::npos &&
        v_.find(word) != kNoToken) {
      out.push_back(v_.find(word));
      return;
    }
    for (size_t offs = 0; offs < word.size();) {
      const size_t n = std::min(utf8_len(word[offs]), word.size() - offs);
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back({index - 1, offs + n == word.size() ? -1 : index + 1, word.data() + offs, n});
      offs += n;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[b.left];
      Symbol& r = symbols_[b.right];
      // Stale when either side was merged away or changed since queuing. llama.cpp compares
      // the texts; the pair's byte positions are fixed, so comparing lengths is the same test.
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size || l.next != b.right) continue;
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = b.left;
      add_bigram(l.prev, b.left);
      add_bigram(b.left, l.next);
    }
    for (int i = 0; i != -1 && !symbols_.empty(); i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  void emit(const Symbol& s, std::vector<int32_t>& out) const {
    const std::string_view text(s.text, s.n);
    const int32_t id = v_.find(text);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    if (v_.byte_encode) {  // each byte of byte-level text is a one-char string here
      for (char c : text) {
        const int32_t b = v_.find(std::string_view(&c, 1));
        if (b != kNoToken) out.push_back(b);
      }
    } else {
      for (char c : text) {
        const int32_t b = v_.byte_to_token(static_cast<uint8_t>(c));
        if (b != kNoToken) out.push_back(b);
      }
    }
  }

  void add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    const int rank = v_.bpe_rank({l.text, l.n}, {r.text, r.n}, scratch_);
    if (rank < 0) return;
    queue_.push({left, right, rank, l.n + r.n});
  }

  const Vocab& v_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue_;
  std::string scratch_;
};

}  // namespace

void bpe_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  std::vector<std::string> words;
  v.pre->split(text, words);
  BpeWord session(v);
  for (const std::string& w : words) session.tokenize(w, out);
}

}  // namespace frink::tok
