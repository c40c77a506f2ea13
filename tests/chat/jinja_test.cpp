// Unit tests of frink's Jinja engine: a table of small templates whose expected outputs are
// what Python's jinja2 3.1 printed for them (in the environment of
// tools/render_chat_template.py), then whitespace rules, error reporting and Python-value
// printing. The jinja2 comparison over whole chat templates is chat_template_parity_test.cpp.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "chat/jinja_template.h"
#include "core/error.h"

namespace frink::jinja {
namespace {

// The variables every case sees (as JSON, key order kept).
constexpr const char* kVars = R"jx({"s": "Hello World", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 1, "a": [1, "x"], "c": null}, "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "bye"}], "u": "Grüße 世界", "t": true, "z": null})jx";

struct Case {
  const char* name;
  const char* tmpl;
  const char* expected;  // jinja2's output
};

const Case kCases[] = {
    {"arithmetic", R"jx({{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 + 1 }})jx", R"jx(7 3 3.5 2 1024 2.5)jx"},
    {"concat", R"jx({{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' + 'cd' }}|{{ 'ab' * 3 }})jx", R"jx(a1NoneTrue|abcd|ababab)jx"},
    {"compare", R"jx({{ 1 < 2 }} {{ 'a' in 'cat' }} {{ 5 not in l }} {{ 3 in l }} {{ 'b' in d }} {{ 1 == 1.0 }} {{ n != 7 }})jx", R"jx(True True True True True True False)jx"},
    {"logic", R"jx({{ z or 'dflt' }}|{{ s and n }}|{{ not z }}|{{ 'y' if t else 'n' }}|{{ 'y' if z }}|)jx", R"jx(dflt|7|True|y||)jx"},
    {"subscripts", R"jx({{ l[0] }} {{ l[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ l[::2] }} {{ u[0:3] }} {{ d['a'][1] }} {{ d.b }} {{ msgs[1].content }})jx", R"jx(3 2 ell dlroW olleH [3, 2] Grü x 1 yo)jx"},
    {"python_str", R"jx({{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 'x') }} {{ (1,) }} {{ d }})jx", R"jx([1, 'a', None, True, 2.0] {'k': 'v', 'n': [1]} (1, 'x') (1,) {'b': 1, 'a': [1, 'x'], 'c': None})jx"},
    {"float_repr", R"jx({{ 0.1 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ 10 / 4 }} {{ 123456789.125 }})jx", R"jx(0.1 1e+20 1e-05 3.0 2.5 123456789.125)jx"},
    {"str_repr", R"jx({{ "it's" }} {{ ["it's", 'say "x"', 'a\nb'] }})jx", R"jx(it's ["it's", 'say "x"', 'a\nb'])jx"},
    {"str_methods", R"jx({{ s.upper() }} {{ s.lower() }} {{ s.split() }} {{ 'a,b,,c'.split(',') }} {{ '  x '.strip() }}|{{ 'xxhixx'.strip('x') }} {{ s.startswith('He') }} {{ s.endswith(('x', 'ld')) }} {{ s.replace('l', 'L') }} {{ s.find('o') }} {{ 'a b'.title() }} {{ 'aBC'.capitalize() }} {{ ', '.join(['a', 'b']) }} {{ '{} + {}'.format(1, 2) }} {{ 'a-b-c'.rsplit('-', 1) }})jx", R"jx(HELLO WORLD hello world ['Hello', 'World'] ['a', 'b', '', 'c'] x|hi True True HeLLo WorLd 4 A B Abc a, b 1 + 2 ['a-b', 'c'])jx"},
    {"dict_methods", R"jx({{ d.get('b') }} {{ d.get('q') }} {{ d.get('q', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %})jx", R"jx(1 None 5 ['b', 'a', 'c'] [1, [1, 'x'], None] b=1;a=[1, 'x'];c=None;)jx"},
    {"mutation", R"jx({% set x = [1] %}{% set _ = x.append(2) %}{{ x }} {{ x.pop() }} {{ x }}{% set e = {'a': 1} %}{% set _ = e.update({'b': 2}) %} {{ e }} {{ e.pop('a') }} {{ e }})jx", R"jx([1, 2] 2 [1] {'a': 1, 'b': 2} 1 {'b': 2})jx"},
    {"tests", R"jx({{ z is none }} {{ q is defined }} {{ q is undefined }} {{ s is string }} {{ n is number }} {{ f is integer }} {{ n is integer }} {{ d is mapping }} {{ l is iterable }} {{ s is sequence }} {{ t is boolean }} {{ t is true }} {{ z is false }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is equalto 7 }} {{ 'a' is in ['a'] }} {{ n is not none }})jx", R"jx(True False True True True False True True True True True True False True False True True True True)jx"},
    {"loop_vars", R"jx({% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %})jx", R"jx(1/0/3/2/True/False/3 2/1/2/1/False/False/3 3/2/1/0/False/True/3 )jx"},
    {"loop_filter", R"jx({% for m in msgs if m.role == 'user' %}{{ loop.index }}:{{ m.content }}{{ ',' if not loop.last }}{% endfor %})jx", R"jx(1:hi,2:bye)jx"},
    {"for_else_break", R"jx({% for x in [] %}no{% else %}empty{% endfor %}|{% for x in l %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %})jx", R"jx(empty|3|32)jx"},
    {"unpack", R"jx({% for a, b in [(1, 2), (3, 4)] %}{{ a + b }} {% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}{% for k in d %}{{ k }}{% endfor %})jx", R"jx(3 7 abbac)jx"},
    {"if_elif", R"jx({% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %})jx", R"jx(mid)jx"},
    {"namespace", R"jx({% set ns = namespace(count=0, last=none) %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }})jx", R"jx(3 user)jx"},
    {"loop_scope", R"jx({% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }})jx", R"jx(1)jx"},
    {"set_forms", R"jx({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %}  inner {{ n }}  {% endset %}[{{ blk }}]{% set t2 | upper %}up{% endset %}{{ t2 }})jx", R"jx(12[  inner 7  ]UP)jx"},
    {"macro", R"jx({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }})jx", R"jx(Hi A! Hi B? Hi C.)jx"},
    {"call_block", R"jx({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %})jx", R"jx(<b>bold 7</b>)jx"},
    {"recursive_macro", R"jx({% macro rec(x) %}{% if x > 0 %}{{ x }}{{ rec(x - 1) }}{% endif %}{% endmacro %}{{ rec(3) }})jx", R"jx(321)jx"},
    {"filter_block", R"jx({% filter upper %}shout {{ s }}{% endfilter %})jx", R"jx(SHOUT HELLO WORLD)jx"},
    {"globals", R"jx({{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }})jx", R"jx([0, 1, 2] [1, 3, 5] {'a': 1})jx"},
    {"tojson", R"jx({{ d | tojson }} {{ u | tojson }} {{ [1, 2.5, none, true] | tojson }} {{ 'a"\\\n' | tojson }})jx", R"jx({"b": 1, "a": [1, "x"], "c": null} "Grüße 世界" [1, 2.5, null, true] "a\"\\\n")jx"},
    {"tojson_indent", R"jx({{ d | tojson(indent=2) }})jx", R"jx({
  "b": 1,
  "a": [
    1,
    "x"
  ],
  "c": null
})jx"},
    {"tojson_opts", R"jx({{ d | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }} {{ u | tojson(ensure_ascii=true) }})jx", R"jx({"a": [1, "x"], "b": 1, "c": null} {"b":1,"a":[1,"x"],"c":null} "Gr\u00fc\u00dfe \u4e16\u754c")jx"},
    {"filters1", R"jx({{ '  x  ' | trim }}|{{ s | length }} {{ u | length }} {{ l | count }} {{ l | join('-') }} {{ msgs | map(attribute='role') | join(',') }} {{ ['a', 'b'] | map('upper') | list }})jx", R"jx(x|11 8 3 3-1-2 user,assistant,user ['A', 'B'])jx"},
    {"filters2", R"jx({{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | first }} {{ l | select('odd') | list }} {{ l | reject('odd') | list }} {{ l | first }} {{ l | last }} {{ msgs | last }})jx", R"jx(2 yo [3, 1] [2] 3 2 {'role': 'user', 'content': 'bye'})jx"},
    {"filters3", R"jx({{ q | default('dv') }} {{ z | default('dv') }} {{ '' | d('e', true) }} {{ s | upper }} {{ s | lower }} {{ s | replace('o', '0') }} {{ n | string }} {{ '42' | int + 1 }} {{ '2.5' | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ -3 | abs }})jx", R"jx(dv None e HELLO WORLD hello world Hell0 W0rld 7 43 2.5 2.57 2.0 3)jx"},
    {"filters4", R"jx({{ [3, 1, 3, 2] | unique | list }} {{ l | sort }} {{ l | sort(reverse=true) }} {{ d | dictsort }} {{ l | reverse | list }} {{ 'ab' | reverse }} {{ msgs | sort(attribute='content') | map(attribute='content') | list }})jx", R"jx([3, 1, 2] [1, 2, 3] [3, 2, 1] [('a', [1, 'x']), ('b', 1), ('c', None)] [2, 1, 3] ba ['bye', 'hi', 'yo'])jx"},
    {"filters5", R"jx({{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'hello world' | capitalize }} {{ 'hello world' | title }} {{ 'one two  three' | wordcount }} {{ d | items | list }} {{ 'x' | safe }} {{ l | sum }} {{ l | min }} {{ l | max }})jx", R"jx(a
  b

  c|  a
  b|Hello world Hello World 3 [('b', 1), ('a', [1, 'x']), ('c', None)] x 6 1 3)jx"},
    {"trim_lstrip", R"jx(A
  {% if true %}
    B
  {% endif %}
C)jx", R"jx(A
    B
C)jx"},
    {"minus_control", R"jx(A  {%- if true -%}  B  {%- endif -%}  C {{- ' D ' -}} E)jx", R"jx(ABC D E)jx"},
    {"var_not_lstripped", R"jx(A
  {{ 'x' }}
  {# comment #}
B
{%+ if true %}k{% endif +%}
Z)jx", R"jx(A
  x
B
k
Z)jx"},
    {"raw", R"jx({% raw %}{{ not evaluated }}{% endraw %})jx", R"jx({{ not evaluated }})jx"},
    {"strftime", R"jx({{ strftime_now('%Y-%m-%d %B %A') }})jx", R"jx(2026-01-15 January Thursday)jx"},
    {"with", R"jx({% with a = 5 %}{{ a }}{% endwith %}{{ a }})jx", R"jx(5)jx"},
    {"trailing_newline", R"jx(line1
)jx", R"jx(line1)jx"},
};

std::string render(const std::string& tmpl, const nlohmann::ordered_json& vars) {
  ChatOptions opts;
  opts.date = "2026-01-15";
  opts.extra = vars;
  return render_chat(tmpl, nlohmann::ordered_json::array(), nullptr, opts);
}

TEST(Jinja, MatchesJinja2OnTheCaseTable) {
  auto vars = nlohmann::ordered_json::parse(kVars);
  for (const auto& c : kCases) {
    std::string got;
    try {
      got = render(c.tmpl, vars);
    } catch (const Error& e) {
      ADD_FAILURE() << c.name << ": raised " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected) << c.name << ": " << c.tmpl;
  }
}

std::string render_plain(const std::string& tmpl) { return Template(tmpl).render(Value::dict()); }

std::string error_of(const std::string& tmpl) {
  try {
    render_plain(tmpl);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, ErrorsNameTheConstructAndLine) {
  EXPECT_EQ(error_of("a\n{% include 'x.jinja' %}"), "chat template line 2: unsupported tag 'include'");
  EXPECT_EQ(error_of("{{ 1 | frobnicate }}"), "chat template line 1: unsupported filter 'frobnicate'");
  EXPECT_EQ(error_of("\n\n{{ x is frob }}"), "chat template line 3: unsupported test 'frob'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "chat template line 1: unsupported recursive for loop");
  EXPECT_EQ(error_of("{{ missing.attr }}"), "chat template line 1: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "chat template line 1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(error_of("{% if x %}"), "chat template line 1: missing {% endif %}");
  EXPECT_EQ(error_of("{{ 'abc'.nosuch() }}"), "chat template line 1: 'str object' has no attribute 'nosuch'");
  EXPECT_EQ(error_of("x\n{{ 'unterminated }}"), "chat template line 2: unterminated string");
  // raise_exception carries the template's message.
  try {
    render("{{ raise_exception('roles must alternate') }}", nlohmann::ordered_json::object());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "chat template line 1: template raised: roles must alternate");
  }
}

TEST(Jinja, UnsupportedIsItsOwnErrorType) {
  EXPECT_THROW(render_plain("{% extends 'base' %}"), UnsupportedError);
  EXPECT_THROW(render_plain("{{ 'a'.zfill(3) }}"), UnsupportedError);  // a Python method frink lacks
  try {
    render_plain("{{ none.x.y }}");
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError&) {
    ADD_FAILURE() << "an undefined read is the template's error, not an unsupported construct";
  } catch (const Error&) {
  }
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
  EXPECT_EQ(render_plain("{% if true %}\n  x\n{% endif %}\n"), "  x\n");
  EXPECT_EQ(render_plain("  {% if true %}a{% endif %}  {% if true %}b{% endif %}"), "a  b");
  EXPECT_EQ(render_plain("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render_plain("a\n{#- note -#}\nb"), "ab");
  EXPECT_EQ(render_plain("{{ 'x' }}\ny"), "x\ny");  // no trim after }}
  EXPECT_EQ(render_plain("a\r\nb\n"), "a\nb");    // CRLF read as LF; one trailing newline dropped
}

TEST(Jinja, ValuesPrintLikePython) {
  EXPECT_EQ(Value::list({Value("a"), Value(int64_t{1}), Value::none(), Value(true)}).to_str(), "['a', 1, None, True]");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(-2.5e-7), "-2.5e-07");
  Value d = Value::dict();
  d.dict_ref().set(Value("z"), Value(int64_t{1}));
  d.dict_ref().set(Value("a"), Value(2.0));
  EXPECT_EQ(d.to_str(), "{'z': 1, 'a': 2.0}");  // insertion order
  EXPECT_EQ(d.to_json(), "{\"z\": 1, \"a\": 2.0}");
  EXPECT_TRUE(Value(int64_t{1}).equals(Value(1.0)));
  EXPECT_TRUE(Value(true).equals(Value(int64_t{1})));
}

TEST(ChatTemplate, ChatMlFallback) {
  auto msgs = nlohmann::ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"U"}])");
  EXPECT_EQ(render_chatml(msgs, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml(msgs, false), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplate, PassesFlagsAndTokens) {
  ChatOptions opts;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  opts.add_generation_prompt = true;
  opts.extra["enable_thinking"] = false;
  auto msgs = nlohmann::ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  std::string t =
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}A:{% endif %}{{ enable_thinking }}{{ tools is defined }}";
  EXPECT_EQ(render_chat(t, msgs, nullptr, opts), "<s>user:hi</s>A:FalseFalse");
  EXPECT_EQ(render_chat(t, msgs, nlohmann::ordered_json::array(), opts), "<s>user:hi</s>A:FalseTrue");
  ChatMessage m{"assistant", std::nullopt, nullptr, "", "", ""};
  EXPECT_EQ(m.to_json().dump(), R"({"role":"assistant","content":null})");
}

}  // namespace
}  // namespace frink::jinja
