// Jinja tests (`x is name(args)`), as jinja2's tests.py defines them. A few follow Python
// quirks on purpose: `true is number` holds (bool is an int), and Undefined counts as
// iterable and as a sequence (it has __iter__, __len__ and __getitem__).
#include <cctype>
#include <cmath>
#include <functional>
#include <unordered_map>

#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace frink::jinja {

namespace {

using TestFn = std::function<bool(const Value&, CallArgs&)>;

const Value& arg(CallArgs& a, size_t i, const char* name, const char* test) {
  const Value* v = a.get(i, name);
  if (!v) fail("test '{}' needs argument '{}'", test, name);
  return *v;
}

bool is_lower(const std::string& s, bool want_lower) {
  bool cased = false;
  for (unsigned char c : s) {
    if (std::isalpha(c)) {
      cased = true;
      if (want_lower ? std::isupper(c) : std::islower(c)) return false;
    }
  }
  return cased;
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = [] {
    std::unordered_map<std::string, TestFn> t;
    t["defined"] = [](const Value& v, CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, CallArgs&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, CallArgs&) { return v.is_bool(); };
    t["true"] = [](const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); };
    t["string"] = [](const Value& v, CallArgs&) { return v.is_string(); };
    t["number"] = [](const Value& v, CallArgs&) { return v.is_number(); };
    t["integer"] = [](const Value& v, CallArgs&) { return v.is_int(); };
    t["float"] = [](const Value& v, CallArgs&) { return v.is_float(); };
    t["mapping"] = [](const Value& v, CallArgs&) { return v.is_dict(); };
    t["iterable"] = [](const Value& v, CallArgs&) {
      return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](const Value& v, CallArgs&) { return v.is_callable(); };
    t["escaped"] = [](const Value&, CallArgs&) { return false; };
    t["lower"] = [](const Value& v, CallArgs&) { return v.is_string() && is_lower(v.str(), true); };
    t["upper"] = [](const Value& v, CallArgs&) { return v.is_string() && is_lower(v.str(), false); };
    t["even"] = [](const Value& v, CallArgs&) {
      if (!v.is_number()) fail("test 'even' needs a number, got {}", v.type_name());
      return v.as_int() % 2 == 0;
    };
    t["odd"] = [](const Value& v, CallArgs&) {
      if (!v.is_number()) fail("test 'odd' needs a number, got {}", v.type_name());
      return v.as_int() % 2 != 0;
    };
    t["divisibleby"] = [](const Value& v, CallArgs& a) {
      const Value& n = arg(a, 0, "num", "divisibleby");
      if (!v.is_number() || !n.is_number() || n.as_int() == 0) fail("bad operands for 'divisibleby'");
      return v.as_int() % n.as_int() == 0;
    };
    t["eq"] = [](const Value& v, CallArgs& a) { return v.equals(arg(a, 0, "other", "eq")); };
    t["equalto"] = t["=="] = t["eq"];
    t["ne"] = [](const Value& v, CallArgs& a) { return !v.equals(arg(a, 0, "other", "ne")); };
    t["!="] = t["ne"];
    t["lt"] = [](const Value& v, CallArgs& a) { return v.compare(arg(a, 0, "other", "lt")) < 0; };
    t["<"] = t["lessthan"] = t["lt"];
    t["le"] = [](const Value& v, CallArgs& a) { return v.compare(arg(a, 0, "other", "le")) <= 0; };
    t["<="] = t["le"];
    t["gt"] = [](const Value& v, CallArgs& a) { return v.compare(arg(a, 0, "other", "gt")) > 0; };
    t[">"] = t["greaterthan"] = t["gt"];
    t["ge"] = [](const Value& v, CallArgs& a) { return v.compare(arg(a, 0, "other", "ge")) >= 0; };
    t[">="] = t["ge"];
    t["sameas"] = [](const Value& v, CallArgs& a) {
      const Value& o = arg(a, 0, "other", "sameas");
      return v.kind() == o.kind() && v.equals(o);
    };
    t["in"] = [](const Value& v, CallArgs& a) {
      const Value& seq = arg(a, 0, "seq", "in");
      if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
      if (seq.is_dict()) return seq.dict_ref().find(v) != nullptr;
      for (const auto& e : seq.iterate())
        if (e.equals(v)) return true;
      return false;
    };
    t["filter"] = [](const Value& v, CallArgs&) { return v.is_string() && has_filter(v.str()); };
    t["test"] = [](const Value& v, CallArgs&) { return v.is_string() && has_test(v.str()); };
    return t;
  }();
  return kTests;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(name) != 0; }

bool apply_test(const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail_unsupported("unsupported test '{}'", name);
  return it->second(input, args);
}

}  // namespace frink::jinja
