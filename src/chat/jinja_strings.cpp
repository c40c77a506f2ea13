// Python str methods on UTF-8 strings; see jinja_strings.h.
#include "chat/jinja_strings.h"

#include <cctype>

#include "core/error.h"

namespace frink::jinja {

namespace {
constexpr const char* kSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
bool is_space(char c) { return std::string_view(kSpace, 10).find(c) != std::string_view::npos; }
}  // namespace

std::string str_lower(const std::string& s) {
  std::string o = s;
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string str_upper(const std::string& s) {
  std::string o = s;
  for (char& c : o) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return o;
}

std::string str_capitalize(const std::string& s) {
  std::string o = str_lower(s);
  if (!o.empty()) o[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(o[0])));
  return o;
}

std::string str_title(const std::string& s) {
  std::string o;
  bool prev_cased = false;
  for (unsigned char c : s) {
    bool alpha = std::isalpha(c);
    o += static_cast<char>(alpha ? (prev_cased ? std::tolower(c) : std::toupper(c)) : c);
    prev_cased = alpha;
  }
  return o;
}

std::string str_lstrip(const std::string& s, const std::string* chars) {
  size_t b = 0;
  while (b < s.size() && (chars ? chars->find(s[b]) != std::string::npos : is_space(s[b]))) ++b;
  return s.substr(b);
}

std::string str_rstrip(const std::string& s, const std::string* chars) {
  size_t e = s.size();
  while (e > 0 && (chars ? chars->find(s[e - 1]) != std::string::npos : is_space(s[e - 1]))) --e;
  return s.substr(0, e);
}

std::string str_strip(const std::string& s, const std::string* chars) {
  return str_lstrip(str_rstrip(s, chars), chars);
}

std::vector<std::string> str_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("split: empty separator");
    size_t b = 0;
    for (;;) {
      size_t e = (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) ? s.find(*sep, b) : std::string::npos;
      if (e == std::string::npos) {
        out.push_back(s.substr(b));
        return out;
      }
      out.push_back(s.substr(b, e - b));
      b = e + sep->size();
    }
  }
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(str_rstrip(s.substr(i), nullptr));
      break;
    }
    size_t e = i;
    while (e < s.size() && !is_space(s[e])) ++e;
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

std::vector<std::string> str_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0 || !sep) return str_split(s, sep, maxsplit);
  std::vector<std::string> out;
  size_t e = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    size_t p = e >= sep->size() ? s.rfind(*sep, e - sep->size()) : std::string::npos;
    if (p == std::string::npos) break;
    out.insert(out.begin(), s.substr(p + sep->size(), e - p - sep->size()));
    e = p;
  }
  out.insert(out.begin(), s.substr(0, e));
  return out;
}

std::vector<std::string> str_splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      out.push_back(s.substr(b, i - b));
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      b = i + 1;
    }
  }
  if (b < s.size()) out.push_back(s.substr(b));
  return out;
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` between every character
    auto chars = utf8_chars(s);
    int64_t n = 0;
    for (const auto& c : chars) {
      if (count < 0 || n++ < count) out += repl;
      out += c;
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t b = 0;
  int64_t n = 0;
  for (;;) {
    size_t e = (count < 0 || n < count) ? s.find(old, b) : std::string::npos;
    if (e == std::string::npos) break;
    out += s.substr(b, e - b) + repl;
    b = e + old.size();
    ++n;
  }
  return out + s.substr(b);
}

std::string percent_format(const std::string& fmt, const std::vector<Value>& args) {
  std::vector<Value> a = args;
  if (a.size() == 1 && a[0].is_tuple()) a = a[0].items();
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (k >= a.size()) fail("not enough arguments for format string");
    const Value& v = a[k++];
    if (c == 's') out += v.to_str();
    else if (c == 'r') out += v.repr();
    else if (c == 'd' || c == 'i') out += std::to_string(v.as_int());
    else if (c == 'f') out += fmt::format("{:.6f}", v.as_float());
    else fail_unsupported("unsupported format character '{}'", c);
  }
  return out;
}

std::string brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '{') {
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) fail("str.format: unmatched '{{'");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        fail_unsupported("str.format: unsupported format spec '{}'", field);
      const Value* v = nullptr;
      if (field.empty()) v = auto_index < args.pos.size() ? &args.pos[auto_index++] : nullptr;
      else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t idx = std::stoul(field);
        v = idx < args.pos.size() ? &args.pos[idx] : nullptr;
      } else {
        v = args.find_kw(field);
      }
      if (!v) fail("str.format: no argument for '{{{}}}'", field);
      out += v->to_str();
      i = e;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace frink::jinja
