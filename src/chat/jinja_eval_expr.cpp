// Evaluation of expression nodes with jinja2's runtime rules (runtime.py, environment.py):
// reading a missing name, key or attribute gives Undefined; reading from Undefined fails;
// `and` / `or` return an operand, not a bool, as in Python.
#include <cmath>

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace frink::jinja {

const Value* Frame::lookup(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

[[noreturn]] static void fail_undefined(const Value& v, const std::string& what) {
  if (v.undefined_why().empty()) fail("{} of an undefined value", what);
  fail("{}", v.undefined_why());
}

Value LiteralExpr::eval(Context&) const { return value; }

Value NameExpr::eval(Context& ctx) const {
  const Value* v = ctx.frame->lookup(name);
  return v ? *v : Value::undefined(fmt::format("'{}' is undefined", name));
}

Value ListExpr::eval(Context& ctx) const {
  ValueList out;
  out.reserve(items.size());
  for (const auto& e : items) out.push_back(e->eval(ctx));
  return is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value DictExpr::eval(Context& ctx) const {
  Value d = Value::dict();
  for (const auto& [k, v] : items) d.dict_ref().set(k->eval(ctx), v->eval(ctx));
  return d;
}

Value UnaryExpr::eval(Context& ctx) const {
  Value v = operand->eval(ctx);
  if (op == "not") return Value(!v.truthy());
  if (!v.is_number()) fail("bad operand type for unary {}: '{}'", op, v.type_name());
  if (op == "+") return v.is_bool() ? Value(v.as_int()) : v;
  return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value binary_arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a, "arithmetic");
  if (b.is_undefined()) fail_undefined(b, "arithmetic");
  if (a.is_number() && b.is_number()) {
    bool fl = a.is_float() || b.is_float();
    if (op == "/") {
      if (b.as_float() == 0) fail("division by zero");
      return Value(a.as_float() / b.as_float());
    }
    if (op == "**") {
      if (!fl && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_float(), b.as_float()));
    }
    if (fl) {
      double x = a.as_float(), y = b.as_float();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0) fail("float division by zero");
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") return Value(x - y * std::floor(x / y));
    } else {
      int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (y == 0) fail("integer division or modulo by zero");
      if (op == "//") return Value(floor_div(x, y));
      if (op == "%") return Value(x - y * floor_div(x, y));
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.is_markup() || b.is_markup())  // Markup.__add__ / __radd__ escape the plain side
      return Value::markup((a.is_markup() ? a.str() : html_escape(a.str())) +
                           (b.is_markup() ? b.str() : html_escape(b.str())));
    return Value(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    ValueList out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
    if (a.is_string()) {
      std::string out;
      for (int64_t i = 0; i < b.as_int(); ++i) out += a.str();
      return Value(out);
    }
    ValueList out;
    for (int64_t i = 0; i < b.as_int(); ++i) out.insert(out.end(), a.items().begin(), a.items().end());
    return Value::list(std::move(out));
  }
  if (op == "*" && (b.is_string() || b.is_list()) && (a.is_int() || a.is_bool()))
    return binary_arith(op, b, a);
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

static bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not {}", item.type_name());
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& e : container.items())
      if (e.equals(item)) return true;
    return false;
  }
  if (container.is_dict()) return container.dict_ref().find(item) != nullptr;
  if (container.is_undefined()) return false;
  fail("argument of type '{}' is not iterable", container.type_name());
}

Value BinaryExpr::eval(Context& ctx) const {
  if (op == "and") {
    Value l = left->eval(ctx);
    return l.truthy() ? right->eval(ctx) : l;
  }
  if (op == "or") {
    Value l = left->eval(ctx);
    return l.truthy() ? l : right->eval(ctx);
  }
  Value l = left->eval(ctx);
  Value r = right->eval(ctx);
  if (op == "~") return Value(l.to_str() + r.to_str());
  if (op == "==") return Value(l.equals(r));
  if (op == "!=") return Value(!l.equals(r));
  if (op == "in") return Value(contains(r, l));
  if (op == "not in") return Value(!contains(r, l));
  if (op == "<") return Value(l.compare(r) < 0);
  if (op == "<=") return Value(l.compare(r) <= 0);
  if (op == ">") return Value(l.compare(r) > 0);
  if (op == ">=") return Value(l.compare(r) >= 0);
  return binary_arith(op, l, r);
}

Value CondExpr::eval(Context& ctx) const {
  if (cond->eval(ctx).truthy()) return then->eval(ctx);
  return otherwise ? otherwise->eval(ctx) : Value::undefined();
}

// jinja2's getattr / getitem: a dict's key, a sequence's index, else Undefined.
static Value get_member(const Value& obj, const Value& key, bool by_attr) {
  if (obj.is_undefined()) fail_undefined(obj, by_attr ? "attribute '" + key.to_str() + "'" : "item");
  if (obj.is_dict()) {
    const Value* v = obj.dict_ref().find(key);
    return v ? *v : Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) return index_value(obj, key);
  return Value::undefined(fmt::format("'{} object' has no attribute {}", obj.type_name(), key.repr()));
}

Value AttrExpr::eval(Context& ctx) const { return get_member(obj->eval(ctx), Value(name), true); }

Value ItemExpr::eval(Context& ctx) const { return get_member(obj->eval(ctx), index->eval(ctx), false); }

Value SliceExpr::eval(Context& ctx) const {
  Value o = obj->eval(ctx);
  Value a = start ? start->eval(ctx) : Value::none();
  Value b = stop ? stop->eval(ctx) : Value::none();
  Value c = step ? step->eval(ctx) : Value::none();
  return slice_value(o, &a, &b, &c);
}

CallArgs eval_args(const std::vector<Arg>& args, Context& ctx) {
  CallArgs out;
  for (const auto& a : args) {
    if (a.name.empty()) out.pos.push_back(a.value->eval(ctx));
    else out.kw.emplace_back(a.name, a.value->eval(ctx));
  }
  return out;
}

Value CallExpr::eval(Context& ctx) const {
  Value f = callee->eval(ctx);
  if (f.is_undefined()) fail_undefined(f, "call");
  if (!f.is_callable()) fail("'{}' object is not callable", f.type_name());
  CallArgs args = eval_args(this->args, ctx);
  return f.fn().fn(args);
}

Value MethodCallExpr::eval(Context& ctx) const {
  Value o = obj->eval(ctx);
  if (o.is_undefined()) fail_undefined(o, "method '" + name + "'");
  CallArgs args = eval_args(this->args, ctx);
  if (o.is_dict()) {  // a namespace's or loop's callable member (loop.cycle)
    const Value* member = o.dict_ref().find(name);
    if (member && member->is_callable()) return member->fn().fn(args);
  }
  return call_method(o, name, args);
}

Value FilterExpr::apply(const Value& input, Context& ctx) const {
  CallArgs args = eval_args(this->args, ctx);
  return apply_filter(name, input, args);
}

Value FilterExpr::eval(Context& ctx) const { return apply(operand->eval(ctx), ctx); }

Value TestExpr::eval(Context& ctx) const {
  Value v = operand->eval(ctx);
  CallArgs args = eval_args(this->args, ctx);
  bool r = apply_test(name, v, args);
  return Value(negated ? !r : r);
}

}  // namespace frink::jinja
