// Methods of Python's str, list and dict that templates call (`content.split('</think>')`,
// `message.get('tool_calls')`, `ns.items.append(x)`), plus indexing and slicing.
// list.append / dict.pop mutate in place: lists and dicts are shared, as in Python.
#include <algorithm>
#include <string_view>

#include "chat/jinja_builtins.h"
#include "chat/jinja_strings.h"
#include "core/error.h"

namespace frink::jinja {

namespace {

// Python's own methods: one of these that frink lacks is "unsupported" (the caller may fall
// back); any other name is the template's error, as jinja2 reports it.
constexpr std::string_view kPythonStrMethods =
    " capitalize casefold center count encode endswith expandtabs find format format_map index"
    " isalnum isalpha isascii isdecimal isdigit isidentifier islower isnumeric isprintable isspace"
    " istitle isupper join ljust lower lstrip maketrans partition removeprefix removesuffix replace"
    " rfind rindex rjust rpartition rsplit rstrip split splitlines startswith strip swapcase title"
    " translate upper zfill ";
constexpr std::string_view kPythonListMethods =
    " append clear copy count extend index insert pop remove reverse sort ";
constexpr std::string_view kPythonDictMethods =
    " clear copy fromkeys get items keys pop popitem setdefault update values ";

[[noreturn]] void missing_method(const char* type, const std::string& name, std::string_view known) {
  if (known.find(" " + name + " ") != std::string_view::npos)
    fail_unsupported("unsupported {} method '{}'", type, name);
  fail("'{} object' has no attribute '{}'", type, name);
}

const Value& need(CallArgs& a, size_t i, const char* name, const std::string& method) {
  const Value* v = a.get(i, name);
  if (!v) fail("{}() missing argument '{}'", method, name);
  return *v;
}

Value opt(CallArgs& a, size_t i, const char* name, Value fallback) {
  const Value* v = a.get(i, name);
  return v ? *v : fallback;
}

Value strings(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value::list(std::move(out));
}

// startswith / endswith take a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  if (affix.is_list()) {
    for (const auto& a : affix.items())
      if (affix_match(s, a, prefix)) return true;
    return false;
  }
  if (!affix.is_string()) fail("{} needs a string, got {}", prefix ? "startswith" : "endswith", affix.type_name());
  const std::string& a = affix.str();
  if (a.size() > s.size()) return false;
  return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

int64_t byte_to_char_index(const std::string& s, size_t byte) {
  return utf8_length(s.substr(0, byte));
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a) {
  auto chars_arg = [&](std::string& buf) -> const std::string* {
    Value c = opt(a, 0, "chars", Value::none());
    if (c.is_none()) return nullptr;
    buf = c.to_str();
    return &buf;
  };
  std::string buf;
  if (name == "strip") return Value(str_strip(s, chars_arg(buf)));
  if (name == "lstrip") return Value(str_lstrip(s, chars_arg(buf)));
  if (name == "rstrip") return Value(str_rstrip(s, chars_arg(buf)));
  if (name == "upper") return Value(str_upper(s));
  if (name == "lower") return Value(str_lower(s));
  if (name == "title") return Value(str_title(s));
  if (name == "capitalize") return Value(str_capitalize(s));
  if (name == "split" || name == "rsplit") {
    Value sep = opt(a, 0, "sep", Value::none());
    int64_t maxsplit = opt(a, 1, "maxsplit", Value(int64_t{-1})).as_int();
    std::string sep_s = sep.is_none() ? "" : sep.to_str();
    const std::string* sp = sep.is_none() ? nullptr : &sep_s;
    return strings(name == "split" ? str_split(s, sp, maxsplit) : str_rsplit(s, sp, maxsplit));
  }
  if (name == "splitlines") return strings(str_splitlines(s));
  if (name == "startswith") return Value(affix_match(s, need(a, 0, "prefix", name), true));
  if (name == "endswith") return Value(affix_match(s, need(a, 0, "suffix", name), false));
  if (name == "replace") {
    return Value(str_replace(s, need(a, 0, "old", name).to_str(), need(a, 1, "new", name).to_str(),
                             opt(a, 2, "count", Value(int64_t{-1})).as_int()));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    std::string sub = need(a, 0, "sub", name).to_str();
    size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name.find("index") != std::string::npos) fail("substring not found");
      return Value(int64_t{-1});
    }
    return Value(byte_to_char_index(s, p));
  }
  if (name == "count") {
    std::string sub = need(a, 0, "sub", name).to_str();
    if (sub.empty()) return Value(utf8_length(s) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& v : need(a, 0, "iterable", name).iterate()) {
      if (!v.is_string()) fail("sequence item: expected str instance, {} found", v.type_name());
      out += (first ? "" : s) + v.str();
      first = false;
    }
    return Value(out);
  }
  if (name == "format") return Value(brace_format(s, a));
  auto all_of = [&](int (*pred)(int)) {
    if (s.empty()) return Value(false);
    return Value(std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return all_of(::isdigit);
  if (name == "isalpha") return all_of(::isalpha);
  if (name == "isalnum") return all_of(::isalnum);
  if (name == "isspace") return all_of(::isspace);
  if (name == "islower") return Value(s != str_upper(s) && s == str_lower(s));
  if (name == "isupper") return Value(s != str_lower(s) && s == str_upper(s));
  missing_method("str", name, kPythonStrMethods);
}

Value list_method(const Value& obj, const std::string& name, CallArgs& a) {
  ValueList& items = obj.items();
  auto norm = [&](int64_t i) { return i < 0 ? i + static_cast<int64_t>(items.size()) : i; };
  if (name == "append") {
    items.push_back(need(a, 0, "object", name));
    return Value::none();
  }
  if (name == "extend") {
    for (const auto& v : need(a, 0, "iterable", name).iterate()) items.push_back(v);
    return Value::none();
  }
  if (name == "insert") {
    int64_t i = std::clamp<int64_t>(norm(need(a, 0, "index", name).as_int()), 0, static_cast<int64_t>(items.size()));
    items.insert(items.begin() + i, need(a, 1, "object", name));
    return Value::none();
  }
  if (name == "pop") {
    int64_t i = norm(opt(a, 0, "index", Value(int64_t{-1})).as_int());
    if (i < 0 || i >= static_cast<int64_t>(items.size())) fail("pop index out of range");
    Value v = items[static_cast<size_t>(i)];
    items.erase(items.begin() + i);
    return v;
  }
  if (name == "remove" || name == "index" || name == "count") {
    const Value& x = need(a, 0, "value", name);
    int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].equals(x)) continue;
      if (name == "remove") {
        items.erase(items.begin() + static_cast<std::ptrdiff_t>(i));
        return Value::none();
      }
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name != "count") fail("list.{}(x): x not in list", name);
    return Value(n);
  }
  if (name == "reverse") {
    std::reverse(items.begin(), items.end());
    return Value::none();
  }
  if (name == "copy") return Value::list(items);
  missing_method("list", name, kPythonListMethods);
}

Value dict_method(const Value& obj, const std::string& name, CallArgs& a) {
  Dict& d = obj.dict_ref();
  if (name == "get") {
    const Value* v = d.find(need(a, 0, "key", name));
    return v ? *v : opt(a, 1, "default", Value::none());
  }
  if (name == "items") {
    ValueList out;
    for (const auto& [k, v] : d.entries()) out.push_back(Value::tuple({k, v}));
    return Value::list(std::move(out));
  }
  if (name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : d.entries()) out.push_back(name == "keys" ? k : v);
    return Value::list(std::move(out));
  }
  if (name == "pop") {
    const Value& key = need(a, 0, "key", name);
    const Value* v = d.find(key);
    if (!v) {
      if (const Value* def = a.get(1, "default")) return *def;
      fail("KeyError: {}", key.repr());
    }
    Value out = *v;
    d.erase(key);
    return out;
  }
  if (name == "setdefault") {
    const Value& key = need(a, 0, "key", name);
    if (const Value* v = d.find(key)) return *v;
    Value def = opt(a, 1, "default", Value::none());
    d.set(key, def);
    return def;
  }
  if (name == "update") {
    if (!a.pos.empty())
      for (const auto& [k, v] : need(a, 0, "other", name).dict_ref().entries()) d.set(k, v);
    for (const auto& [k, v] : a.kw) d.set(Value(k), v);
    return Value::none();
  }
  if (name == "copy") {
    Value out = Value::dict();
    for (const auto& [k, v] : d.entries()) out.dict_ref().set(k, v);
    return out;
  }
  missing_method("dict", name, kPythonDictMethods);
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, CallArgs& args) {
  if (obj.is_string()) return string_method(obj.str(), name, args);
  if (obj.is_list()) return list_method(obj, name, args);
  if (obj.is_dict()) return dict_method(obj, name, args);
  fail("'{}' object has no attribute '{}'", obj.type_name(), name);
}

Value index_value(const Value& obj, const Value& index) {
  int64_t i = index.as_int();
  if (obj.is_list()) {
    int64_t n = static_cast<int64_t>(obj.items().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    return obj.items()[static_cast<size_t>(i)];
  }
  if (obj.is_string()) {
    auto chars = utf8_chars(obj.str());
    int64_t n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    return Value(chars[static_cast<size_t>(i)]);
  }
  return Value::undefined();
}

Value slice_value(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) fail("slice of an undefined value");
  bool is_str = obj.is_string();
  if (!is_str && !obj.is_list()) fail("'{}' object is not subscriptable", obj.type_name());
  std::vector<std::string> chars;
  if (is_str) chars = utf8_chars(obj.str());
  int64_t n = is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.items().size());
  int64_t st = (step && !step->is_none()) ? step->as_int() : 1;
  if (st == 0) fail("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value* v, int64_t def) -> int64_t {
    if (!v || v->is_none()) return def;
    int64_t x = v->as_int();
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t b = adjust(start, st < 0 ? n - 1 : 0);
  int64_t e = adjust(stop, st < 0 ? -1 : n);
  std::string s_out;
  ValueList l_out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (is_str) s_out += chars[static_cast<size_t>(i)];
    else l_out.push_back(obj.items()[static_cast<size_t>(i)]);
  }
  if (is_str) return Value(s_out);
  return obj.is_tuple() ? Value::tuple(std::move(l_out)) : Value::list(std::move(l_out));
}

}  // namespace frink::jinja
