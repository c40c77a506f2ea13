// Python semantics for jinja values: str()/repr(), json.dumps, equality and ordering.
#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace frink::jinja {

const Value* CallArgs::find_kw(const std::string& name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t i, const std::string& name) const {
  if (i < pos.size()) return &pos[i];
  return find_kw(name);
}

Value Value::undefined(std::string why) {
  Value v;
  v.s_ = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::dict() {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>();
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict_ref().set(Value(it.key()), from_json(it.value()));
      return d;
    }
    default: fail("chat template input: unsupported JSON value");
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_.empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return dict_->size() != 0;
    case Kind::kCallable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-d.ddde+XX"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponent form outside [1e-4, 1e16)
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp + 1) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return neg ? "-" + out : out;
}

static std::string py_str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  out += q;
  return out;
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return float_repr(f_);
    case Kind::kString: return py_str_repr(s_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries()) {
        out += (first ? "" : ", ") + k.repr() + ": " + v.repr();
        first = false;
      }
      return out + "}";
    }
    case Kind::kCallable: return "<function " + fn_->name + ">";
  }
  return "";
}

static void json_escape(const std::string& s, std::string& out, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (ensure_ascii && c >= 0x80) {  // \uXXXX, with a surrogate pair above the BMP
      size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
      i += n - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

namespace {
struct JsonWriter {
  int indent;
  bool sort_keys, ensure_ascii;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  }
  void write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return;
      case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
      case Value::Kind::kFloat: {
        double f = v.as_float();
        if (std::isnan(f)) out += "NaN";
        else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
        else out += float_repr(f);
        return;
      }
      case Value::Kind::kString: json_escape(v.str(), out, ensure_ascii); return;
      case Value::Kind::kList: {
        const auto& items = v.items();
        if (items.empty()) { out += "[]"; return; }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(level + 1);
          write(items[i], level + 1);
        }
        if (indent >= 0) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        auto entries = v.dict_ref().entries();
        if (entries.empty()) { out += "{}"; return; }
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& a, const auto& b) { return a.first.compare(b.first) < 0; });
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep;
          if (indent >= 0) newline(level + 1);
          const Value& k = entries[i].first;
          if (k.is_string()) json_escape(k.str(), out, ensure_ascii);
          else if (k.is_none()) out += "\"null\"";
          else if (k.is_bool()) out += k.as_bool() ? "\"true\"" : "\"false\"";
          else json_escape(k.repr(), out, ensure_ascii);
          out += key_sep;
          write(entries[i].second, level + 1);
        }
        if (indent >= 0) newline(level);
        out += '}';
        return;
      }
      default: fail("Object of type {} is not JSON serializable", v.type_name());
    }
  }
};
}  // namespace

std::string Value::to_json() const { return to_json(JsonOptions{}); }

std::string Value::to_json(const JsonOptions& o) const {
  JsonWriter w{o.indent, o.sort_keys, o.ensure_ascii,
               o.item_sep ? *o.item_sep : (o.indent >= 0 ? "," : ", "), o.key_sep.value_or(": "), {}};
  w.write(*this, 0);
  return w.out;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_float() == o.as_float();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return s_ == o.s_;
    case Kind::kList: {
      if (tuple_ != o.tuple_ || list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      return true;
    }
    case Kind::kDict: {
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : dict_->entries()) {
        const Value* ov = o.dict_->find(k);
        if (!ov || !v.equals(*ov)) return false;
      }
      return true;
    }
    case Kind::kCallable: return fn_ == o.fn_;
    default: return false;
  }
}

int Value::compare(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) {
      double a = as_float(), b = o.as_float();
      return a < b ? -1 : (a > b ? 1 : 0);
    }
    return as_int() < o.as_int() ? -1 : (as_int() > o.as_int() ? 1 : 0);
  }
  if (is_string() && o.is_string()) return s_ < o.s_ ? -1 : (s_ > o.s_ ? 1 : 0);  // UTF-8 keeps code-point order
  if (is_list() && o.is_list()) {
    size_t n = std::min(list_->size(), o.list_->size());
    for (size_t i = 0; i < n; ++i)
      if (int c = (*list_)[i].compare((*o.list_)[i])) return c;
    return list_->size() < o.list_->size() ? -1 : (list_->size() > o.list_->size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '{}' and '{}'", type_name(), o.type_name());
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return utf8_length(s_);
    case Kind::kList: return static_cast<int64_t>(list_->size());
    case Kind::kDict: return static_cast<int64_t>(dict_->size());
    default: fail("object of type '{}' has no len()", type_name());
  }
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& e : dict_->entries()) keys.push_back(e.first);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (auto& c : utf8_chars(s_)) chars.emplace_back(std::move(c));
      return chars;
    }
    default: fail("'{}' object is not iterable", type_name());
  }
}

std::string Value::hash_key() const {
  switch (kind_) {
    case Kind::kString: return "s" + s_;
    case Kind::kBool:
    case Kind::kInt: return "n" + std::to_string(i_);
    case Kind::kFloat:
      if (f_ == std::floor(f_) && std::abs(f_) < 9e18) return "n" + std::to_string(static_cast<int64_t>(f_));
      return "f" + float_repr(f_);
    case Kind::kNone: return "N";
    case Kind::kList:
      if (tuple_) {
        std::string k = "t(";
        for (const auto& e : *list_) k += e.hash_key() + ",";
        return k + ")";
      }
      break;
    default: break;
  }
  fail("unhashable type: '{}'", type_name());
}

const Value* Dict::find(const Value& key) const {
  if (!(key.is_string() || key.is_number() || key.is_none() || key.is_tuple())) return nullptr;
  auto it = index_.find(key.hash_key());
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::set(const Value& key, Value v) {
  std::string h = key.hash_key();
  auto it = index_.find(h);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(v);
    return;
  }
  index_.emplace(std::move(h), entries_.size());
  entries_.emplace_back(key, std::move(v));
}

bool Dict::erase(const Value& key) {
  auto it = index_.find(key.hash_key());
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first.hash_key(), i);
  return true;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace frink::jinja
