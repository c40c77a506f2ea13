// Tokens -> statement tree, with jinja2's operator precedence (parser.py): ternary, or, and,
// not, comparisons (incl. in / not in), + -, ~, * / // %, **, unary -, then postfix
// (.attr, [index], [a:b:c], calls) and filters / tests, which bind tightest.
// Tags outside the supported set (include, extends, import, block, recursive loops, ...)
// throw frink::Error naming the tag and its line.
#pragma once

#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace frink::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace frink::jinja
