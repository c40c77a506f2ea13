// Template text -> tokens; see jinja_lexer.h for the whitespace rules (jinja2's lexer.py).
#include "chat/jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"

namespace frink::jinja {

namespace {

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;  // jinja2: the previous match ended with "\n"
    while (pos_ < src_.size()) {
      size_t p = find_tag(pos_);
      std::string text = src_.substr(pos_, p == std::string::npos ? std::string::npos : p - pos_);
      if (p == std::string::npos) {
        push_text(text);
        break;
      }
      char kind = src_[p + 1];  // '{', '%' or '#'
      char sign = p + 2 < src_.size() ? src_[p + 2] : '\0';
      if (sign == '-') {
        size_t e = text.find_last_not_of(" \t\n\r\f\v");
        text = e == std::string::npos ? "" : text.substr(0, e + 1);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) &&
            text.find_first_not_of(" \t", l_pos) == std::string::npos)
          text.resize(l_pos);
      }
      push_text(text);
      count_lines(pos_, p);
      pos_ = p + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '{');
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    toks_.push_back(Token{TokKind::kEof, "", 0, 0, line_});
    return std::move(toks_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> toks_;

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
    return std::string::npos;
  }
  void count_lines(size_t b, size_t e) {
    for (size_t i = b; i < e && i < src_.size(); ++i)
      if (src_[i] == '\n') ++line_;
  }
  void push_text(const std::string& t) {
    if (!t.empty()) toks_.push_back(Token{TokKind::kText, t, 0, 0, line_});
  }
  // After a closing `%}`/`#}` (trim) or `-%}` (strip all whitespace).
  void after_close(bool minus, bool plus, bool is_block) {
    if (minus) {
      size_t e = pos_;
      while (e < src_.size() && std::isspace(static_cast<unsigned char>(src_[e]))) ++e;
      count_lines(pos_, e);
      pos_ = e;
    } else if (is_block && !plus && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }
  void lex_comment() {
    size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) fail("chat template line {}: unterminated comment", line_);
    bool minus = e > pos_ && src_[e - 1] == '-';
    bool plus = e > pos_ && src_[e - 1] == '+';
    count_lines(pos_, e + 2);
    pos_ = e + 2;
    after_close(minus, plus, true);
  }
  void lex_tag(bool is_var) {
    toks_.push_back(Token{is_var ? TokKind::kVarBegin : TokKind::kBlockBegin, "", 0, 0, line_});
    size_t first_tok = toks_.size();
    int depth = 0;  // brackets open inside the tag, so `}}` of a dict literal does not end it
    for (;;) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail("chat template line {}: unterminated tag", line_);
      const char* close = is_var ? "}}" : "%}";
      bool minus = src_.compare(pos_, 3, std::string("-") + close) == 0;
      bool plus = !is_var && src_.compare(pos_, 3, std::string("+") + close) == 0;
      if (depth == 0 && (minus || plus || src_.compare(pos_, 2, close) == 0)) {
        pos_ += (minus || plus) ? 3 : 2;
        toks_.push_back(Token{is_var ? TokKind::kVarEnd : TokKind::kBlockEnd, "", 0, 0, line_});
        after_close(minus, plus, !is_var);
        if (!is_var && toks_.size() == first_tok + 2 && toks_[first_tok].kind == TokKind::kName &&
            toks_[first_tok].text == "raw")
          lex_raw();
        return;
      }
      lex_expr_token(depth);
    }
  }
  // {% raw %}...{% endraw %}: the body is text, tags and all.
  void lex_raw() {
    toks_.resize(toks_.size() - 3);  // drop `{% raw %}`
    size_t p = pos_;
    for (;;) {
      p = src_.find("{%", p);
      if (p == std::string::npos) fail("chat template line {}: raw block without endraw", line_);
      size_t q = p + 2;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        std::string body = src_.substr(pos_, p - pos_);
        if (src_[p + 2] == '-') {
          size_t e = body.find_last_not_of(" \t\n\r\f\v");
          body = e == std::string::npos ? "" : body.substr(0, e + 1);
        }
        push_text(body);
        count_lines(pos_, p);
        size_t e = src_.find("%}", q);
        if (e == std::string::npos) fail("chat template line {}: unterminated endraw", line_);
        bool minus = src_[e - 1] == '-';
        pos_ = e + 2;
        after_close(minus, src_[e - 1] == '+', true);
        return;
      }
      p += 2;
    }
  }
  void lex_expr_token(int& depth) {
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      toks_.push_back(Token{TokKind::kName, src_.substr(pos_, e - pos_), 0, 0, line_});
      pos_ = e;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    static const char* kOps2[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kOps2)
      if (src_.compare(pos_, 2, op) == 0) {
        toks_.push_back(Token{TokKind::kOp, op, 0, 0, line_});
        pos_ += 2;
        return;
      }
    if (std::strchr("+-*/%~<>=()[]{}.,:|", c) == nullptr || c == '\0')
      fail("chat template line {}: unexpected character '{}'", line_, c);
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    toks_.push_back(Token{TokKind::kOp, std::string(1, c), 0, 0, line_});
    ++pos_;
  }
  void lex_number() {
    size_t e = pos_;
    bool is_float = false;
    while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        is_float = true;
        e = f;
        while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
      }
    }
    std::string num;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') num += src_[i];
    Token t{is_float ? TokKind::kFloat : TokKind::kInt, num, 0, 0, line_};
    if (is_float) t.fval = std::stod(num);
    else t.ival = std::stoll(num);
    toks_.push_back(t);
    pos_ = e;
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)); out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // Python string-literal escapes, as jinja2 decodes them.
  void lex_string(char q) {
    int start_line = line_;
    std::string out;
    size_t i = pos_ + 1;
    for (;; ++i) {
      if (i >= src_.size()) fail("chat template line {}: unterminated string", start_line);
      char c = src_[i];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= src_.size()) {
        out += c;
        continue;
      }
      char n = src_[++i];
      switch (n) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': ++line_; break;
        case 'x': case 'u': case 'U': {
          size_t nd = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          if (i + nd >= src_.size()) fail("chat template line {}: bad \\{} escape", line_, n);
          append_utf8(out, static_cast<uint32_t>(std::stoul(src_.substr(i + 1, nd), nullptr, 16)));
          i += nd;
          break;
        }
        default: out += '\\'; out += n;
      }
    }
    toks_.push_back(Token{TokKind::kString, out, 0, 0, start_line});
    pos_ = i + 1;
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r' && i + 1 < source.size() && source[i + 1] == '\n') continue;
    src += source[i];
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline=False
  return Lexer(std::move(src)).run();
}

}  // namespace frink::jinja
