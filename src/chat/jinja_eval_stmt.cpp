// Execution of statement nodes: output, if, for (with jinja2's `loop` object), set, macro,
// call blocks, filter blocks. Errors raised below a statement get its line prepended once.
#include <string_view>

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace frink::jinja {

namespace {
constexpr std::string_view kLinePrefix = "chat template line ";
constexpr int kMaxCallDepth = 200;  // recursive macros (json_to_python_type) nest a few levels

void bind_targets(Frame& frame, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    frame.vars[targets[0]] = v;
    return;
  }
  ValueList items = v.iterate();
  if (items.size() != targets.size())
    fail("cannot unpack {} values into {} names", items.size(), targets.size());
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
}
}  // namespace

Flow exec_body(const Body& body, Context& ctx) {
  for (const auto& s : body) {
    Flow f;
    try {
      f = s->exec(ctx);
    } catch (const Error& e) {
      std::string_view what = e.what();
      if (what.substr(0, kLinePrefix.size()) == kLinePrefix) throw;
      std::string msg = fmt::format("{}{}: {}", kLinePrefix, s->line, what);
      if (dynamic_cast<const UnsupportedError*>(&e)) throw UnsupportedError(msg);
      throw Error(msg);
    }
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::string capture(const Body& body, Context& ctx) {
  std::string buf;
  std::string* saved = ctx.out;
  ctx.out = &buf;
  exec_body(body, ctx);
  ctx.out = saved;
  return buf;
}

Flow TextStmt::exec(Context& ctx) const {
  *ctx.out += text;
  return Flow::kNormal;
}

Flow OutputStmt::exec(Context& ctx) const {
  *ctx.out += expr->eval(ctx).to_str();
  return Flow::kNormal;
}

Flow IfStmt::exec(Context& ctx) const {
  for (const auto& [cond, body] : branches)
    if (cond->eval(ctx).truthy()) return exec_body(body, ctx);
  return exec_body(otherwise, ctx);
}

Flow ForStmt::exec(Context& ctx) const {
  Value seq = iter->eval(ctx);
  ValueList all = seq.iterate();
  auto frame = std::make_shared<Frame>();
  frame->parent = ctx.frame;
  ValueList items;
  if (filter) {
    std::shared_ptr<Frame> saved = ctx.frame;
    ctx.frame = frame;
    for (const auto& v : all) {
      bind_targets(*frame, targets, v);
      if (filter->eval(ctx).truthy()) items.push_back(v);
    }
    ctx.frame = saved;
  } else {
    items = std::move(all);
  }
  if (items.empty()) return exec_body(otherwise, ctx);

  std::shared_ptr<Frame> saved = ctx.frame;
  ctx.frame = frame;
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    bind_targets(*frame, targets, items[i]);
    Value loop = Value::dict();
    Dict& d = loop.dict_ref();
    d.set("index", Value(i + 1));
    d.set("index0", Value(i));
    d.set("revindex", Value(n - i));
    d.set("revindex0", Value(n - i - 1));
    d.set("first", Value(i == 0));
    d.set("last", Value(i == n - 1));
    d.set("length", Value(n));
    d.set("depth", Value(int64_t{1}));
    d.set("depth0", Value(int64_t{0}));
    if (i > 0) d.set("previtem", items[i - 1]);
    if (i + 1 < n) d.set("nextitem", items[i + 1]);
    d.set("cycle", Value::callable("loop.cycle", [i](CallArgs& a) -> Value {
      if (a.pos.empty()) fail("loop.cycle needs at least one argument");
      return a.pos[static_cast<size_t>(i) % a.pos.size()];
    }));
    frame->vars["loop"] = loop;
    Flow f = exec_body(body, ctx);
    if (f == Flow::kBreak) break;
  }
  ctx.frame = saved;
  return Flow::kNormal;
}

Flow SetStmt::exec(Context& ctx) const {
  Value v;
  if (value) {
    v = value->eval(ctx);
  } else {
    v = Value(capture(body, ctx));
    for (const auto& f : filters) v = f->apply(v, ctx);
  }
  if (!attr.empty()) {
    const Value* ns = ctx.frame->lookup(targets[0]);
    if (!ns || !ns->is_dict()) fail("cannot assign attribute '{}' on '{}', not a namespace", attr, targets[0]);
    ns->dict_ref().set(Value(attr), v);
    return Flow::kNormal;
  }
  bind_targets(*ctx.frame, targets, v);
  return Flow::kNormal;
}

Value MacroStmt::make_callable(Context& ctx, const std::shared_ptr<Frame>& closure) const {
  // The closure is held weakly: a frame holding a macro that held the frame would never be
  // freed. Macros never outlive the render whose frames they close over.
  std::weak_ptr<Frame> weak = closure;
  int* depth = ctx.call_depth;
  const MacroStmt* self = this;
  return Value::callable(name, [self, weak, depth](CallArgs& args) -> Value {
    std::shared_ptr<Frame> parent = weak.lock();
    if (!parent) fail("macro '{}' called after its scope ended", self->name);
    if (*depth >= kMaxCallDepth) fail("macro '{}' nests deeper than {} calls", self->name, kMaxCallDepth);
    auto frame = std::make_shared<Frame>();
    frame->parent = parent;
    Context sub{frame, nullptr, depth};
    ValueList varargs;
    for (size_t i = self->params.size(); i < args.pos.size(); ++i) varargs.push_back(args.pos[i]);
    for (size_t i = 0; i < self->params.size(); ++i) {
      const MacroParam& p = self->params[i];
      if (i < args.pos.size()) frame->vars[p.name] = args.pos[i];
      else if (const Value* kv = args.find_kw(p.name)) frame->vars[p.name] = *kv;
      else if (p.default_value) frame->vars[p.name] = p.default_value->eval(sub);
      else frame->vars[p.name] = Value::undefined(fmt::format("'{}' is undefined", p.name));
    }
    Value kwargs = Value::dict();
    for (const auto& [k, v] : args.kw) {
      bool is_param = false;
      for (const auto& p : self->params) is_param |= p.name == k;
      if (k == "caller") frame->vars["caller"] = v;
      else if (!is_param) kwargs.dict_ref().set(Value(k), v);
    }
    frame->vars["varargs"] = Value::list(std::move(varargs));
    frame->vars["kwargs"] = kwargs;
    ++*depth;
    std::string out;
    sub.out = &out;
    exec_body(self->body, sub);
    --*depth;
    return Value(out);
  });
}

Flow MacroStmt::exec(Context& ctx) const {
  ctx.frame->vars[name] = make_callable(ctx, ctx.frame);
  return Flow::kNormal;
}

Flow CallBlockStmt::exec(Context& ctx) const {
  Value f = call->callee->eval(ctx);
  if (!f.is_callable()) fail("{{% call %}} of a non-callable '{}'", f.type_name());
  CallArgs args = eval_args(call->args, ctx);
  args.kw.emplace_back("caller", caller.make_callable(ctx, ctx.frame));
  *ctx.out += f.fn().fn(args).to_str();
  return Flow::kNormal;
}

Flow FilterBlockStmt::exec(Context& ctx) const {
  Value v(capture(body, ctx));
  for (const auto& f : filters) v = f->apply(v, ctx);
  *ctx.out += v.to_str();
  return Flow::kNormal;
}

Flow WithStmt::exec(Context& ctx) const {
  auto frame = std::make_shared<Frame>();
  frame->parent = ctx.frame;
  for (const auto& [name, e] : assigns) frame->vars[name] = e->eval(ctx);
  std::shared_ptr<Frame> saved = ctx.frame;
  ctx.frame = frame;
  Flow f = exec_body(body, ctx);
  ctx.frame = saved;
  return f;
}

Flow DoStmt::exec(Context& ctx) const {
  expr->eval(ctx);
  return Flow::kNormal;
}

}  // namespace frink::jinja
