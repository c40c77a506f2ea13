// Global functions every template sees (jinja2's DEFAULT_NAMESPACE minus lipsum), and the
// Template entry points.
#include "chat/jinja_builtins.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_parser.h"
#include "chat/jinja_template.h"
#include "core/error.h"

namespace frink::jinja {

namespace {

Value range_fn(CallArgs& a) {
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else if (a.pos.size() >= 2) {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() >= 3) step = a.pos[2].as_int();
  } else {
    fail("range expected at least 1 argument");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit (MAX_RANGE)
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) fail("range too big (over {})", kMaxRange);
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

// namespace(d, k=v): a dict whose attributes `{% set ns.k = v %}` may assign.
Value dict_fn(CallArgs& a) {
  Value d = Value::dict();
  for (const auto& p : a.pos) {
    if (!p.is_dict()) fail("namespace()/dict() positional argument must be a mapping");
    for (const auto& [k, v] : p.dict_ref().entries()) d.dict_ref().set(k, v);
  }
  for (const auto& [k, v] : a.kw) d.dict_ref().set(Value(k), v);
  return d;
}

Value cycler_fn(CallArgs& a) {
  Value c = Value::dict();
  auto items = std::make_shared<ValueList>(a.pos);
  auto pos = std::make_shared<size_t>(0);
  c.dict_ref().set(Value("next"), Value::callable("cycler.next", [items, pos](CallArgs&) -> Value {
    if (items->empty()) return Value::none();
    Value v = (*items)[*pos % items->size()];
    ++*pos;
    return v;
  }));
  c.dict_ref().set(Value("reset"), Value::callable("cycler.reset", [pos](CallArgs&) -> Value {
    *pos = 0;
    return Value::none();
  }));
  return c;
}

Value joiner_fn(CallArgs& a) {
  std::string sep = a.pos.empty() ? ", " : a.pos[0].to_str();
  auto used = std::make_shared<bool>(false);
  return Value::callable("joiner", [sep, used](CallArgs&) -> Value {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

}  // namespace

void add_builtin_globals(Dict& globals) {
  globals.set(Value("range"), Value::callable("range", range_fn));
  globals.set(Value("namespace"), Value::callable("namespace", dict_fn));
  globals.set(Value("dict"), Value::callable("dict", dict_fn));
  globals.set(Value("cycler"), Value::callable("cycler", cycler_fn));
  globals.set(Value("joiner"), Value::callable("joiner", joiner_fn));
}

Template::Template(const std::string& source) : body_(parse(tokenize(source))) {}

std::string Template::render(const Value& vars) const {
  auto globals = std::make_shared<Frame>();
  Value g = Value::dict();
  add_builtin_globals(g.dict_ref());
  for (const auto& [k, v] : g.dict_ref().entries()) globals->vars[k.str()] = v;
  auto top = std::make_shared<Frame>();
  top->parent = globals;
  if (vars.is_dict())
    for (const auto& [k, v] : vars.dict_ref().entries()) top->vars[k.to_str()] = v;
  std::string out;
  int depth = 0;
  Context ctx{top, &out, &depth};
  exec_body(body_, ctx);
  return out;
}

}  // namespace frink::jinja
