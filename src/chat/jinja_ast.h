// The parsed form of a Jinja template: expression and statement nodes, each evaluated by its
// own virtual method (bodies in jinja_eval_expr.cpp and jinja_eval_stmt.cpp), and the
// Context they run in. Every node keeps its template line for error messages.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace frink::jinja {

// One variable scope. Jinja scopes: the template, each for loop, each macro call and each
// `with` block; `if` opens none. Assignments write to the innermost scope only, which is why
// templates use namespace() to carry values out of a loop.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* lookup(const std::string& name) const;
};

struct Context {
  std::shared_ptr<Frame> frame;
  std::string* out = nullptr;     // where text goes; swapped to capture macro and block output
  int* call_depth = nullptr;      // the render's macro nesting, to refuse runaway recursion
};

enum class Flow { kNormal, kBreak, kContinue };

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Context& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual Flow exec(Context& ctx) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
Flow exec_body(const Body& body, Context& ctx);

// ---- expressions ----
struct LiteralExpr : Expr {
  Value value;
  Value eval(Context&) const override;
};
struct NameExpr : Expr {
  std::string name;
  Value eval(Context& ctx) const override;
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  Value eval(Context& ctx) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Context& ctx) const override;
};
struct UnaryExpr : Expr {
  std::string op;  // "-", "+", "not"
  ExprPtr operand;
  Value eval(Context& ctx) const override;
};
struct BinaryExpr : Expr {
  std::string op;  // arithmetic, "~", "and", "or", "in", "not in", comparisons
  ExprPtr left, right;
  Value eval(Context& ctx) const override;
};
struct CondExpr : Expr {  // a if cond else b
  ExprPtr cond, then, otherwise;  // otherwise may be null (undefined)
  Value eval(Context& ctx) const override;
};
struct AttrExpr : Expr {  // obj.name
  ExprPtr obj;
  std::string name;
  Value eval(Context& ctx) const override;
};
struct ItemExpr : Expr {  // obj[index]
  ExprPtr obj, index;
  Value eval(Context& ctx) const override;
};
struct SliceExpr : Expr {  // obj[start:stop:step], each part optional
  ExprPtr obj, start, stop, step;
  Value eval(Context& ctx) const override;
};
struct Arg {
  std::string name;  // empty for positional
  ExprPtr value;
};
CallArgs eval_args(const std::vector<Arg>& args, Context& ctx);
struct CallExpr : Expr {
  ExprPtr callee;
  std::vector<Arg> args;
  Value eval(Context& ctx) const override;
};
struct MethodCallExpr : Expr {  // obj.name(args): a str/list/dict method, or a callable member
  ExprPtr obj;
  std::string name;
  std::vector<Arg> args;
  Value eval(Context& ctx) const override;
};
struct FilterExpr : Expr {  // operand | name(args); operand null inside a filter block
  ExprPtr operand;
  std::string name;
  std::vector<Arg> args;
  Value eval(Context& ctx) const override;
  Value apply(const Value& input, Context& ctx) const;
};
struct TestExpr : Expr {  // operand is [not] name(args)
  ExprPtr operand;
  std::string name;
  std::vector<Arg> args;
  bool negated = false;
  Value eval(Context& ctx) const override;
};

// ---- statements ----
struct TextStmt : Stmt {
  std::string text;
  Flow exec(Context& ctx) const override;
};
struct OutputStmt : Stmt {
  ExprPtr expr;
  Flow exec(Context& ctx) const override;
};
struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if and each elif
  Body otherwise;
  Flow exec(Context& ctx) const override;
};
struct ForStmt : Stmt {
  std::vector<std::string> targets;  // one name, or several to unpack
  ExprPtr iter, filter;              // filter: `for x in xs if cond`, may be null
  Body body, otherwise;
  Flow exec(Context& ctx) const override;
};
struct SetStmt : Stmt {
  std::vector<std::string> targets;  // names; or one name with attr set (ns.attr = ...)
  std::string attr;
  ExprPtr value;                     // null for a block set
  Body body;                         // block set: {% set x %}...{% endset %}
  std::vector<std::unique_ptr<FilterExpr>> filters;  // block set filters
  Flow exec(Context& ctx) const override;
};
struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};
struct MacroStmt : Stmt {
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  Flow exec(Context& ctx) const override;
  // The callable that runs this macro with `closure` as the enclosing scope.
  Value make_callable(Context& ctx, const std::shared_ptr<Frame>& closure) const;
};
struct CallBlockStmt : Stmt {  // {% call(params) macro(args) %}body{% endcall %}
  MacroStmt caller;            // the body, as the macro `caller`
  std::unique_ptr<CallExpr> call;
  Flow exec(Context& ctx) const override;
};
struct FilterBlockStmt : Stmt {
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  Flow exec(Context& ctx) const override;
};
struct WithStmt : Stmt {
  std::vector<std::pair<std::string, ExprPtr>> assigns;
  Body body;
  Flow exec(Context& ctx) const override;
};
struct LoopControlStmt : Stmt {
  Flow flow;
  Flow exec(Context&) const override { return flow; }
};
struct DoStmt : Stmt {
  ExprPtr expr;
  Flow exec(Context& ctx) const override;
};

// Renders `body` into a fresh string (macro bodies, block sets, filter blocks).
std::string capture(const Body& body, Context& ctx);

}  // namespace frink::jinja
