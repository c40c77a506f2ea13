// Splits a Jinja template into text and tag tokens, applying jinja2's whitespace rules as
// Hugging Face configures them (trim_blocks and lstrip_blocks ON):
//  - `{%-` / `{{-` / `{#-` strip all whitespace before the tag; `-%}` / `-}}` / `-#}` after it.
//  - lstrip_blocks: spaces and tabs between a line start and `{%` or `{#` are dropped
//    (not before `{{`, and not with `{%+`).
//  - trim_blocks: the first newline after `%}` or `#}` is dropped (not after `}}`).
//  - one trailing newline of the whole template is dropped (keep_trailing_newline=False),
//    and "\r\n" reads as "\n".
// Inside tags it produces expression tokens (names, literals, operators).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace frink::jinja {

enum class TokKind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  TokKind kind;
  std::string text;  // text, name, operator, or the decoded string literal
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
};

// Throws frink::Error naming the line on an unterminated tag or string, or a stray character.
std::vector<Token> tokenize(const std::string& source);

}  // namespace frink::jinja
