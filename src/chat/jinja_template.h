// frink's compact Jinja engine: the public face. No Jinja library for C++ is packaged for
// Debian, so frink carries its own, sized to what real chat templates use (statements, loops
// with `loop`, macros and call blocks, namespaces, Python-flavoured values, jinja2's filters
// and tests, Python str/list/dict methods). It renders as Hugging Face's jinja2 environment
// does: trim_blocks and lstrip_blocks ON. Anything outside that set (include, extends,
// recursive loops, an unknown filter, ...) throws frink::Error naming it and its line;
// nothing is silently skipped.
//
// Files: jinja_lexer (text -> tokens, whitespace control), jinja_parser (tokens -> tree),
// jinja_ast (the tree), jinja_eval_expr / jinja_eval_stmt (running it), jinja_value
// (Python-like values), jinja_filters, jinja_tests, jinja_methods, jinja_strings, jinja_globals.
#pragma once

#include <string>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace frink::jinja {

class Template {
 public:
  // Parses `source`; throws frink::Error "chat template line N: ..." on a syntax error or an
  // unsupported tag.
  explicit Template(const std::string& source);

  // Renders with `vars` (a dict: name -> value) on top of the builtin globals (range,
  // namespace, dict, cycler, joiner). Throws frink::Error "chat template line N: ..." when
  // the template fails (raise_exception, reading from an undefined value, a bad operand).
  std::string render(const Value& vars) const;

 private:
  Body body_;
};

}  // namespace frink::jinja
