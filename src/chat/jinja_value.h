// Values of frink's compact Jinja engine, with Python's semantics because chat templates are
// written against jinja2 running in Python: ints and floats stay distinct (1 / 2 is 0.5,
// 7 // 2 is 3), lists and dicts are shared by reference (`list.append` in a loop is seen by
// the caller), dicts keep insertion order, and printing a list or dict gives Python's str()
// (`['a', 1]`, `{'k': True}`). Undefined is jinja2's default Undefined: it prints as "",
// is false, iterates as empty, and fails only when an attribute or item is read from it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"

namespace frink::jinja {

// A construct the engine does not implement (a tag, filter, test or method). Distinct from
// other template errors so a caller can fall back to another renderer for it, while an
// error the template raises on purpose (raise_exception) still reaches the user.
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& what) : Error(what) {}
};

template <typename... Args>
[[noreturn]] void fail_unsupported(fmt::format_string<Args...> f, Args&&... args) {
  throw UnsupportedError(fmt::format(f, std::forward<Args>(args)...));
}

class Value;
using ValueList = std::vector<Value>;

// Arguments of a call: positional, then keyword in call order.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  const Value* find_kw(const std::string& name) const;
  // Positional i, else keyword `name`, else nullptr.
  const Value* get(size_t i, const std::string& name) const;
};

using NativeFn = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;  // for error messages
  NativeFn fn;
};

class Dict;

// json.dumps's arguments. Separators default as json.dumps's do: (", ", ": "), or
// (",", ": ") when indent is given.
struct JsonOptions {
  int indent = -1;  // < 0: None (one line)
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::optional<std::string> item_sep, key_sep;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  // `why` is what jinja2 would say on use: "'x' is undefined" or
  // "'dict object' has no attribute 'x'" (empty when unknown).
  static Value undefined(std::string why = {});
  static Value none();
  Value(bool b);
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  // markupsafe.Markup (from `| safe`): a string that HTML-escapes what is added to it.
  // Without autoescape that is the only place it differs from a str, and one shared template
  // (functionary v3.1) relies on it.
  static Value markup(std::string s);
  static Value list(ValueList items = {});
  static Value tuple(ValueList items);
  static Value dict();
  static Value callable(std::string name, NativeFn fn);
  static Value from_json(const nlohmann::ordered_json& j);  // objects keep their key order

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return is_string() && markup_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return is_list() && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return is_float() ? static_cast<int64_t>(f_) : i_; }  // bool: 0/1
  double as_float() const { return is_float() ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return s_; }  // strings only
  ValueList& items() const { return *list_; }    // lists only; shared
  Dict& dict_ref() const { return *dict_; }       // dicts only; shared
  const Callable& fn() const { return *fn_; }
  const std::string& undefined_why() const { return s_; }

  bool truthy() const;
  std::string type_name() const;  // Python's type name, for errors ("str", "dict", ...)
  std::string to_str() const;     // Python's str(); undefined gives ""
  std::string repr() const;       // Python's repr()
  // json.dumps with `o` (as transformers' tojson calls it). Throws frink::Error on
  // undefined or a callable, as json.dumps does.
  std::string to_json(const struct JsonOptions& o) const;
  std::string to_json() const;

  // Python equality (1 == 1.0 == True; lists and dicts compare deeply).
  bool equals(const Value& o) const;
  // Python ordering; throws frink::Error for types Python cannot order.
  int compare(const Value& o) const;
  // Number of items (len()); throws for numbers.
  int64_t length() const;
  // Python iteration: list items, dict keys, string characters (code points), undefined empty.
  ValueList iterate() const;
  // Key used to index dicts: equal Python keys (1, 1.0, True) give equal strings.
  std::string hash_key() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  bool markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;  // string value, or why a value is undefined
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// An insertion-ordered dict (Python 3.7+). Keys are Values; lookups go through hash_key().
class Dict {
 public:
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const { return find(Value(key)); }
  void set(const Value& key, Value v);
  bool erase(const Value& key);  // keeps the order of the rest

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Python's repr of a float ("1.0", "0.1", "1e-05", "inf").
std::string float_repr(double v);

// UTF-8 strings indexed by code point, as Python's str is.
std::vector<std::string> utf8_chars(const std::string& s);
int64_t utf8_length(const std::string& s);

}  // namespace frink::jinja
