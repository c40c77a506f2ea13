// Jinja filters (`x | name(args)`), following jinja2's filters.py, except `tojson`, which is
// transformers' override: json.dumps(x, ensure_ascii=False, indent=..., separators=...,
// sort_keys=...), so non-ASCII text stays as is and "<" is not escaped.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <unordered_map>

#include "chat/jinja_builtins.h"
#include "chat/jinja_strings.h"
#include "core/error.h"

namespace frink::jinja {

namespace {

using FilterFn = std::function<Value(const Value&, CallArgs&)>;

Value opt(CallArgs& a, size_t i, const char* name, Value fallback) {
  const Value* v = a.get(i, name);
  return v ? *v : fallback;
}

// jinja2's make_attrgetter: "a.b" walks dicts; a missing key gives Undefined.
Value get_attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  for (;;) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (cur.is_dict()) {
      const Value* f = cur.dict_ref().find(Value(part));
      cur = f ? *f : Value::undefined(fmt::format("'dict object' has no attribute '{}'", part));
    } else if (cur.is_list() && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))) {
      cur = index_value(cur, Value(static_cast<int64_t>(std::stoll(part))));
    } else {
      cur = Value::undefined(fmt::format("'{} object' has no attribute '{}'", cur.type_name(), part));
    }
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

// Key for sorting / unique: case-folded strings unless case_sensitive (jinja2's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(str_lower(v.str()));
  return v;
}

ValueList sorted(ValueList items, bool reverse, bool case_sensitive, const Value& attribute) {
  auto key = [&](const Value& v) {
    return sort_key(attribute.is_undefined() || attribute.is_none() ? v : get_attribute(v, attribute.to_str()),
                    case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    int c = key(a).compare(key(b));
    return reverse ? c > 0 : c < 0;
  });
  return items;
}

ValueList select_items(const Value& seq, CallArgs& a, bool by_attr, bool keep_if) {
  ValueList out;
  size_t first_test_arg = by_attr ? 1 : 0;
  std::string attr = by_attr ? opt(a, 0, "attribute", Value("")).to_str() : "";
  bool has_test_name = a.pos.size() > first_test_arg;
  std::string test = has_test_name ? a.pos[first_test_arg].to_str() : "";
  CallArgs test_args;
  for (size_t i = first_test_arg + 1; i < a.pos.size(); ++i) test_args.pos.push_back(a.pos[i]);
  if (!seq.truthy()) return out;  // jinja2's select_or_reject: `if value:` before iterating
  for (const auto& v : seq.iterate()) {
    Value x = by_attr ? get_attribute(v, attr) : v;
    bool r = has_test_name ? apply_test(test, x, test_args) : x.truthy();
    if (r == keep_if) out.push_back(v);
  }
  return out;
}

std::string do_indent(std::string s, const Value& width, bool first, bool blank) {
  std::string ind = width.is_string() ? width.str() : std::string(static_cast<size_t>(width.as_int()), ' ');
  s += "\n";  // jinja2's own quirk, so splitlines keeps a trailing empty line
  std::vector<std::string> lines = str_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv.append("\n").append(ind);
      rv.append(lines[i]);
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv.append("\n");
      if (!lines[i].empty()) rv.append(ind).append(lines[i]);
    }
  }
  return first ? ind + rv : rv;
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_int());
  if (v.is_string()) {
    std::string s = str_strip(v.str(), nullptr);
    try {
      size_t n = 0;
      int64_t i = std::stoll(s, &n, 10);
      if (n == s.size()) return Value(i);
      double d = std::stod(s, &n);
      if (n == s.size()) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    try {
      size_t n = 0;
      std::string s = str_strip(v.str(), nullptr);
      double d = std::stod(s, &n);
      if (n == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value tojson(const Value& v, CallArgs& a) {
  bool ensure_ascii = opt(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = opt(a, 1, "indent", Value::none());
  Value seps = opt(a, 2, "separators", Value::none());
  bool sort_keys = opt(a, 3, "sort_keys", Value(false)).truthy();
  JsonOptions o;
  o.indent = indent.is_none() ? -1 : static_cast<int>(indent.as_int());
  o.sort_keys = sort_keys;
  o.ensure_ascii = ensure_ascii;
  if (seps.is_list()) {
    if (seps.items().size() != 2) fail("tojson separators must be a pair");
    o.item_sep = seps.items()[0].to_str();
    o.key_sep = seps.items()[1].to_str();
  }
  return Value(v.to_json(o));
}

Value do_map(const Value& seq, CallArgs& a) {
  ValueList out;
  if (!seq.truthy()) return Value::list();  // jinja2: `if value:` before iterating
  if (const Value* attr = a.find_kw("attribute")) {
    const Value* def = a.find_kw("default");
    for (const auto& v : seq.iterate()) {
      Value x = get_attribute(v, attr->to_str());
      out.push_back(x.is_undefined() && def ? *def : x);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) fail("map needs a filter name or attribute=");
  std::string name = a.pos[0].to_str();
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& v : seq.iterate()) {
    CallArgs copy = rest;
    out.push_back(apply_filter(name, v, copy));
  }
  return Value::list(std::move(out));
}

Value do_round(const Value& v, CallArgs& a) {
  int64_t precision = opt(a, 0, "precision", Value(int64_t{0})).as_int();
  std::string method = opt(a, 1, "method", Value("common")).to_str();
  double x = v.as_float();
  double scale = std::pow(10.0, static_cast<double>(precision));
  double y = x * scale;
  if (method == "ceil") y = std::ceil(y);
  else if (method == "floor") y = std::floor(y);
  else y = std::nearbyint(y);  // Python's round(): half to even
  return Value(y / scale);
}

std::string do_title(const std::string& s) {
  // jinja2: capitalise each run after a separator in [-\s({\[<]
  std::string out;
  bool start = true;
  for (unsigned char c : s) {
    bool sep = std::isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += static_cast<char>(c);
      start = true;
    } else {
      out += static_cast<char>(start ? std::toupper(c) : std::tolower(c));
      start = false;
    }
  }
  return out;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

ValueList dict_items(const Value& v) {
  ValueList out;
  if (v.is_undefined()) return out;
  if (!v.is_dict()) fail("items filter needs a mapping, got {}", v.type_name());
  for (const auto& [k, x] : v.dict_ref().entries()) out.push_back(Value::tuple({k, x}));
  return out;
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = [] {
    std::unordered_map<std::string, FilterFn> f;
    f["tojson"] = tojson;
    f["safe"] = [](const Value& v, CallArgs&) { return Value::markup(v.to_str()); };
    f["string"] = [](const Value& v, CallArgs&) { return Value(v.to_str()); };
    f["escape"] = [](const Value& v, CallArgs&) {
      return v.is_markup() ? v : Value::markup(html_escape(v.to_str()));
    };
    f["e"] = f["escape"];
    f["length"] = [](const Value& v, CallArgs&) { return Value(v.length()); };
    f["count"] = f["length"];
    f["trim"] = [](const Value& v, CallArgs& a) {
      Value chars = opt(a, 0, "chars", Value::none());
      std::string c = chars.is_none() ? "" : chars.to_str();
      return Value(str_strip(v.to_str(), chars.is_none() ? nullptr : &c));
    };
    f["upper"] = [](const Value& v, CallArgs&) { return Value(str_upper(v.to_str())); };
    f["lower"] = [](const Value& v, CallArgs&) { return Value(str_lower(v.to_str())); };
    f["capitalize"] = [](const Value& v, CallArgs&) { return Value(str_capitalize(v.to_str())); };
    f["title"] = [](const Value& v, CallArgs&) { return Value(do_title(v.to_str())); };
    f["default"] = [](const Value& v, CallArgs& a) {
      Value def = opt(a, 0, "default_value", Value(""));
      bool boolean = opt(a, 1, "boolean", Value(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return def;
      return v;
    };
    f["d"] = f["default"];
    f["join"] = [](const Value& v, CallArgs& a) {
      std::string sep = opt(a, 0, "d", Value("")).to_str();
      Value attr = opt(a, 1, "attribute", Value::none());
      std::string out;
      bool first = true;
      for (const auto& x : v.iterate()) {
        out += (first ? "" : sep) + (attr.is_none() ? x : get_attribute(x, attr.to_str())).to_str();
        first = false;
      }
      return Value(out);
    };
    f["first"] = [](const Value& v, CallArgs&) {
      ValueList items = v.iterate();
      return items.empty() ? Value::undefined() : items.front();
    };
    f["last"] = [](const Value& v, CallArgs&) {
      ValueList items = v.iterate();
      return items.empty() ? Value::undefined() : items.back();
    };
    f["list"] = [](const Value& v, CallArgs&) { return Value::list(v.iterate()); };
    f["reverse"] = [](const Value& v, CallArgs&) {
      if (v.is_string()) {
        auto chars = utf8_chars(v.str());
        std::string out;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
        return Value(out);
      }
      ValueList items = v.iterate();
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    };
    f["map"] = do_map;
    f["select"] = [](const Value& v, CallArgs& a) { return Value::list(select_items(v, a, false, true)); };
    f["reject"] = [](const Value& v, CallArgs& a) { return Value::list(select_items(v, a, false, false)); };
    f["selectattr"] = [](const Value& v, CallArgs& a) { return Value::list(select_items(v, a, true, true)); };
    f["rejectattr"] = [](const Value& v, CallArgs& a) { return Value::list(select_items(v, a, true, false)); };
    f["attr"] = [](const Value& v, CallArgs& a) {
      return v.is_dict() ? get_attribute(v, opt(a, 0, "name", Value("")).to_str()) : Value::undefined();
    };
    f["replace"] = [](const Value& v, CallArgs& a) {
      Value count = opt(a, 2, "count", Value::none());
      return Value(str_replace(v.to_str(), opt(a, 0, "old", Value("")).to_str(),
                               opt(a, 1, "new", Value("")).to_str(), count.is_none() ? -1 : count.as_int()));
    };
    f["int"] = [](const Value& v, CallArgs& a) { return to_int(v, opt(a, 0, "default", Value(int64_t{0}))); };
    f["float"] = [](const Value& v, CallArgs& a) { return to_float(v, opt(a, 0, "default", Value(0.0))); };
    f["round"] = do_round;
    f["abs"] = [](const Value& v, CallArgs&) {
      if (!v.is_number()) fail("bad operand type for abs(): '{}'", v.type_name());
      return v.is_float() ? Value(std::fabs(v.as_float())) : Value(static_cast<int64_t>(std::llabs(v.as_int())));
    };
    f["unique"] = [](const Value& v, CallArgs& a) {
      bool cs = opt(a, 0, "case_sensitive", Value(false)).truthy();
      Value attr = opt(a, 1, "attribute", Value::none());
      ValueList out, seen;
      for (const auto& x : v.iterate()) {
        Value k = sort_key(attr.is_none() ? x : get_attribute(x, attr.to_str()), cs);
        bool dup = false;
        for (const auto& s : seen) dup |= s.equals(k);
        if (!dup) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::list(std::move(out));
    };
    f["sort"] = [](const Value& v, CallArgs& a) {
      return Value::list(sorted(v.iterate(), opt(a, 0, "reverse", Value(false)).truthy(),
                                opt(a, 1, "case_sensitive", Value(false)).truthy(),
                                opt(a, 2, "attribute", Value::none())));
    };
    f["dictsort"] = [](const Value& v, CallArgs& a) {
      bool cs = opt(a, 0, "case_sensitive", Value(false)).truthy();
      bool by_value = opt(a, 1, "by", Value("key")).to_str() == "value";
      bool reverse = opt(a, 2, "reverse", Value(false)).truthy();
      ValueList items = dict_items(v);
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        int c = sort_key(x.items()[by_value], cs).compare(sort_key(y.items()[by_value], cs));
        return reverse ? c > 0 : c < 0;
      });
      return Value::list(std::move(items));
    };
    f["items"] = [](const Value& v, CallArgs&) { return Value::list(dict_items(v)); };
    f["min"] = [](const Value& v, CallArgs& a) {
      ValueList s = sorted(v.iterate(), false, opt(a, 0, "case_sensitive", Value(false)).truthy(),
                           opt(a, 1, "attribute", Value::none()));
      return s.empty() ? Value::undefined() : s.front();
    };
    f["max"] = [](const Value& v, CallArgs& a) {
      ValueList s = sorted(v.iterate(), false, opt(a, 0, "case_sensitive", Value(false)).truthy(),
                           opt(a, 1, "attribute", Value::none()));
      return s.empty() ? Value::undefined() : s.back();
    };
    f["sum"] = [](const Value& v, CallArgs& a) {
      Value attr = opt(a, 0, "attribute", Value::none());
      Value total = opt(a, 1, "start", Value(int64_t{0}));
      for (const auto& x : v.iterate())
        total = binary_arith("+", total, attr.is_none() ? x : get_attribute(x, attr.to_str()));
      return total;
    };
    f["indent"] = [](const Value& v, CallArgs& a) {
      return Value(do_indent(v.to_str(), opt(a, 0, "width", Value(int64_t{4})),
                             opt(a, 1, "first", Value(false)).truthy(), opt(a, 2, "blank", Value(false)).truthy()));
    };
    f["wordcount"] = [](const Value& v, CallArgs&) {
      int64_t n = 0;
      bool in_word = false;
      for (unsigned char c : v.to_str()) {
        bool w = std::isalnum(c) || c == '_' || c >= 0x80;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value(n);
    };
    f["format"] = [](const Value& v, CallArgs& a) { return Value(percent_format(v.to_str(), a.pos)); };
    f["center"] = [](const Value& v, CallArgs& a) {
      std::string s = v.to_str();
      int64_t width = opt(a, 0, "width", Value(int64_t{80})).as_int();
      int64_t n = utf8_length(s);
      if (n >= width) return Value(s);
      int64_t total = width - n, left = total / 2 + (total & width & 1);
      return Value(std::string(static_cast<size_t>(left), ' ') + s +
                   std::string(static_cast<size_t>(total - left), ' '));
    };
    return f;
  }();
  return kFilters;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail_unsupported("unsupported filter '{}'", name);
  return it->second(input, args);
}

}  // namespace frink::jinja
