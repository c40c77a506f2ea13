// Recursive-descent parser for the Jinja subset chat templates use; see jinja_parser.h.
#include "chat/jinja_parser.h"

#include <set>

#include "core/error.h"

namespace frink::jinja {

namespace {

template <typename T>
std::unique_ptr<T> node(int line) {
  auto n = std::make_unique<T>();
  n->line = line;
  return n;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : t_(toks) {}

  Body parse_template() {
    std::string stop;
    Body body = parse_body({}, stop);
    return body;
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == TokKind::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TokKind::kName && cur().text == n; }
  [[noreturn]] void error(const std::string& what) const {
    fail("chat template line {}: {}", cur().line, what);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokKind::kEof: return "end of template";
      case TokKind::kBlockEnd: return "end of tag '%}'";
      case TokKind::kVarEnd: return "end of print '}}'";
      case TokKind::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(fmt::format("expected '{}', got {}", op, describe(cur())));
    ++i_;
  }
  std::string expect_name() {
    if (cur().kind != TokKind::kName) error(fmt::format("expected a name, got {}", describe(cur())));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().kind != TokKind::kBlockEnd) error(fmt::format("expected '%}}', got {}", describe(cur())));
    ++i_;
  }

  // Statements until `{% name %}` with name in `stops` (left as the current token's name,
  // returned in `stop`), or the end of the template when `stops` is empty.
  Body parse_body(const std::set<std::string>& stops, std::string& stop) {
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.kind == TokKind::kEof) {
        if (!stops.empty()) error(fmt::format("missing {{% {} %}}", *stops.rbegin()));
        return body;
      }
      if (t.kind == TokKind::kText) {
        auto s = node<TextStmt>(t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.kind == TokKind::kVarBegin) {
        ++i_;
        auto s = node<OutputStmt>(t.line);
        s->expr = parse_tuple();
        if (cur().kind != TokKind::kVarEnd) error(fmt::format("expected '}}}}', got {}", describe(cur())));
        ++i_;
        body.push_back(std::move(s));
      } else if (t.kind == TokKind::kBlockBegin) {
        const Token& name = peek();
        if (name.kind == TokKind::kName && stops.count(name.text)) {
          ++i_;
          stop = name.text;
          ++i_;
          return body;
        }
        ++i_;
        body.push_back(parse_statement());
      } else {
        error(fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  StmtPtr parse_statement() {
    int line = cur().line;
    std::string kw = expect_name();
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "call") return parse_call_block(line);
    if (kw == "filter") return parse_filter_block(line);
    if (kw == "with") return parse_with(line);
    if (kw == "break" || kw == "continue") {
      auto s = node<LoopControlStmt>(line);
      s->flow = kw == "break" ? Flow::kBreak : Flow::kContinue;
      expect_block_end();
      return s;
    }
    if (kw == "do") {
      auto s = node<DoStmt>(line);
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (kw == "generation") {  // transformers' assistant-mask tag: renders its body
      expect_block_end();
      auto s = node<WithStmt>(line);
      std::string stop;
      s->body = parse_body({"endgeneration"}, stop);
      expect_block_end();
      return s;
    }
    fail_unsupported("chat template line {}: unsupported tag '{}'", line, kw);
  }

  StmtPtr parse_if(int line) {
    auto s = node<IfStmt>(line);
    ExprPtr cond = parse_tuple();
    for (;;) {
      expect_block_end();
      std::string stop;
      Body body = parse_body({"elif", "else", "endif"}, stop);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cond = parse_tuple();
        continue;
      }
      if (stop == "else") {
        expect_block_end();
        s->otherwise = parse_body({"endif"}, stop);
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for(int line) {
    auto s = node<ForStmt>(line);
    bool paren = is_op("(");
    if (paren) ++i_;
    s->targets.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      s->targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
    if (!is_name("in")) error("expected 'in' in for loop");
    ++i_;
    s->iter = parse_tuple(/*with_cond=*/false);
    if (is_name("if")) {
      ++i_;
      s->filter = parse_expr();
    }
    if (is_name("recursive")) fail_unsupported("chat template line {}: unsupported recursive for loop", line);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"else", "endfor"}, stop);
    if (stop == "else") {
      expect_block_end();
      s->otherwise = parse_body({"endfor"}, stop);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = node<SetStmt>(line);
    s->targets.push_back(expect_name());
    if (is_op(".")) {
      ++i_;
      s->attr = expect_name();
    } else {
      while (is_op(",")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
    }
    if (is_op("=")) {
      ++i_;
      s->value = parse_tuple();
      expect_block_end();
      return s;
    }
    while (is_op("|")) {
      ++i_;
      s->filters.push_back(parse_filter_call(nullptr));
    }
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endset"}, stop);
    expect_block_end();
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name();
      if (is_op("=")) {
        ++i_;
        p.default_value = parse_expr();
      }
      params.push_back(std::move(p));
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  StmtPtr parse_macro(int line) {
    auto s = node<MacroStmt>(line);
    s->name = expect_name();
    parse_params(s->params);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endmacro"}, stop);
    if (cur().kind == TokKind::kName) ++i_;  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = node<CallBlockStmt>(line);
    s->caller.line = line;
    s->caller.name = "caller";
    if (is_op("(")) parse_params(s->caller.params);
    ExprPtr e = parse_expr();
    auto* call = dynamic_cast<CallExpr*>(e.get());
    if (!call) fail("chat template line {}: {{% call %}} needs a macro call", line);
    e.release();
    s->call.reset(call);
    expect_block_end();
    std::string stop;
    s->caller.body = parse_body({"endcall"}, stop);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = node<FilterBlockStmt>(line);
    s->filters.push_back(parse_filter_call(nullptr));
    while (is_op("|")) {
      ++i_;
      s->filters.push_back(parse_filter_call(nullptr));
    }
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endfilter"}, stop);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = node<WithStmt>(line);
    while (cur().kind == TokKind::kName) {
      std::string name = expect_name();
      expect_op("=");
      s->assigns.emplace_back(name, parse_expr());
      if (!is_op(",")) break;
      ++i_;
    }
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endwith"}, stop);
    expect_block_end();
    return s;
  }

  // ---- expressions ----
  // A comma-separated list becomes a tuple (`{% set a, b = 1, 2 %}`, `{{ a, b }}`).
  ExprPtr parse_tuple(bool with_cond = true) {
    int line = cur().line;
    ExprPtr first = with_cond ? parse_expr() : parse_or();
    if (!is_op(",")) return first;
    auto t = node<ListExpr>(line);
    t->is_tuple = true;
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().kind == TokKind::kBlockEnd || cur().kind == TokKind::kVarEnd || is_op(")")) break;
      t->items.push_back(with_cond ? parse_expr() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expr() {  // ternary
    int line = cur().line;
    ExprPtr e = parse_or();
    while (is_name("if")) {
      ++i_;
      auto c = node<CondExpr>(line);
      c->then = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        ++i_;
        c->otherwise = parse_expr();
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto b = node<BinaryExpr>(line);
    b->op = std::move(op);
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      ++i_;
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      ++i_;
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      auto u = node<UnaryExpr>(cur().line);
      ++i_;
      u->op = "not";
      u->operand = parse_not();
      return u;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    for (;;) {
      int line = cur().line;
      std::string op;
      if (cur().kind == TokKind::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().kind == TokKind::kName && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return e;
      }
      // Chained comparisons (a < b < c) are rare in templates; they evaluate left to right.
      e = binary(op, std::move(e), parse_math1(), line);
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      int line = cur().line;
      std::string op = t_[i_++].text;
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      ++i_;
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      int line = cur().line;
      std::string op = t_[i_++].text;
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      ++i_;
      e = binary("**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = node<UnaryExpr>(cur().line);
      u->op = t_[i_++].text;
      u->operand = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.kind == TokKind::kName) {
      ++i_;
      auto lit = node<LiteralExpr>(line);
      if (t.text == "true" || t.text == "True") lit->value = Value(true);
      else if (t.text == "false" || t.text == "False") lit->value = Value(false);
      else if (t.text == "none" || t.text == "None") lit->value = Value::none();
      else {
        auto n = node<NameExpr>(line);
        n->name = t.text;
        return n;
      }
      return lit;
    }
    if (t.kind == TokKind::kString) {
      std::string s;
      while (cur().kind == TokKind::kString) s += t_[i_++].text;  // adjacent literals join
      auto lit = node<LiteralExpr>(line);
      lit->value = Value(s);
      return lit;
    }
    if (t.kind == TokKind::kInt || t.kind == TokKind::kFloat) {
      ++i_;
      auto lit = node<LiteralExpr>(line);
      lit->value = t.kind == TokKind::kInt ? Value(t.ival) : Value(t.fval);
      return lit;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        auto tup = node<ListExpr>(line);
        tup->is_tuple = true;
        return tup;
      }
      ExprPtr e = parse_expr();
      if (is_op(",")) {
        auto tup = node<ListExpr>(line);
        tup->is_tuple = true;
        tup->items.push_back(std::move(e));
        while (is_op(",")) {
          ++i_;
          if (is_op(")")) break;
          tup->items.push_back(parse_expr());
        }
        e = std::move(tup);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto l = node<ListExpr>(line);
      while (!is_op("]")) {
        l->items.push_back(parse_expr());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++i_;
      auto d = node<DictExpr>(line);
      while (!is_op("}")) {
        ExprPtr k = parse_expr();
        expect_op(":");
        d->items.emplace_back(std::move(k), parse_expr());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return d;
    }
    error(fmt::format("unexpected {} in expression", describe(t)));
  }

  std::vector<Arg> parse_call_args() {
    expect_op("(");
    std::vector<Arg> args;
    while (!is_op(")")) {
      Arg a;
      if (is_op("*") || is_op("**")) fail_unsupported("chat template line {}: unsupported *args / **kwargs in a call", cur().line);
      if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == "=") {
        a.name = t_[i_].text;
        i_ += 2;
      }
      a.value = parse_expr();
      args.push_back(std::move(a));
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      int line = cur().line;
      if (is_op(".")) {
        ++i_;
        std::string name;
        if (cur().kind == TokKind::kInt) name = std::to_string(t_[i_++].ival);
        else name = expect_name();
        if (is_op("(")) {
          auto m = node<MethodCallExpr>(line);
          m->obj = std::move(e);
          m->name = name;
          m->args = parse_call_args();
          e = std::move(m);
        } else {
          auto a = node<AttrExpr>(line);
          a->obj = std::move(e);
          a->name = name;
          e = std::move(a);
        }
      } else if (is_op("[")) {
        ++i_;
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        auto c = node<CallExpr>(line);
        c->callee = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int n_colons = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        ++i_;
        if (++n_colons > 2) error("bad slice");
        continue;
      }
      if (parts[n_colons]) error("bad subscript");
      parts[n_colons] = parse_expr();
    }
    expect_op("]");
    if (n_colons == 0) {
      auto it = node<ItemExpr>(line);
      it->obj = std::move(obj);
      if (!parts[0]) error("empty subscript");
      it->index = std::move(parts[0]);
      return it;
    }
    auto s = node<SliceExpr>(line);
    s->obj = std::move(obj);
    s->start = std::move(parts[0]);
    s->stop = std::move(parts[1]);
    s->step = std::move(parts[2]);
    return s;
  }

  std::unique_ptr<FilterExpr> parse_filter_call(ExprPtr operand) {
    auto f = node<FilterExpr>(cur().line);
    f->operand = std::move(operand);
    f->name = expect_name();
    if (is_op("(")) f->args = parse_call_args();
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        auto t = node<TestExpr>(cur().line);
        ++i_;
        if (is_name("not")) {
          t->negated = true;
          ++i_;
        }
        t->name = expect_name();
        if (is_op("(")) {
          t->args = parse_call_args();
        } else if ((cur().kind == TokKind::kName || cur().kind == TokKind::kString ||
                    cur().kind == TokKind::kInt || cur().kind == TokKind::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if")) {
          Arg a;
          a.value = parse_postfix(parse_primary());
          t->args.push_back(std::move(a));
        }
        t->operand = std::move(e);
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = node<CallExpr>(cur().line);
        c->callee = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace frink::jinja
