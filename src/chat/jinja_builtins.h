// The engine's built-in vocabulary: filters (`x | name(args)`), tests (`x is name(args)`),
// methods of str / list / dict (`s.split(',')`), and the global functions every template
// sees (range, namespace, dict, cycler, joiner). Each throws frink::Error for an unknown name
// ("unsupported filter 'x'") or a bad argument.
#pragma once

#include <string>

#include "chat/jinja_value.h"

namespace frink::jinja {

Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value call_method(const Value& obj, const std::string& name, CallArgs& args);

// Python operators on values (jinja_eval_expr.cpp): + - * / // % **.
Value binary_arith(const std::string& op, const Value& a, const Value& b);

// Python indexing for lists and strings, and slices (steps may be negative).
Value index_value(const Value& obj, const Value& index);
Value slice_value(const Value& obj, const Value* start, const Value* stop, const Value* step);

// markupsafe's escape(): & < > " ' as entities.
std::string html_escape(const std::string& s);

// Fills `globals` with the builtin functions.
void add_builtin_globals(Dict& globals);

}  // namespace frink::jinja
