// Python's str operations that chat templates call, on UTF-8 text. Case mapping is ASCII
// only (templates case-map role names and keywords); everything else follows Python exactly.
#pragma once

#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace frink::jinja {

std::string str_lower(const std::string& s);
std::string str_upper(const std::string& s);
std::string str_capitalize(const std::string& s);  // first upper, rest lower
std::string str_title(const std::string& s);       // Python str.title()
// strip/lstrip/rstrip: `chars` null means whitespace.
std::string str_strip(const std::string& s, const std::string* chars);
std::string str_lstrip(const std::string& s, const std::string* chars);
std::string str_rstrip(const std::string& s, const std::string* chars);
// str.split(sep, maxsplit): sep null splits on whitespace runs and drops empty parts.
std::vector<std::string> str_split(const std::string& s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> str_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> str_splitlines(const std::string& s);
std::string str_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
// "fmt" % args with %s %r %d %i %f %%.
std::string percent_format(const std::string& fmt, const std::vector<Value>& args);
// str.format: {} {0} {name} and {{ }}; a format spec after ':' is refused.
std::string brace_format(const std::string& fmt, const CallArgs& args);

}  // namespace frink::jinja
