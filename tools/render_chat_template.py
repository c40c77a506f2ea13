#!/usr/bin/env python3
"""Render a chat template with Python's jinja2 the way Hugging Face transformers does.

The reference for frink's own Jinja engine (src/chat): tests/chat compares the two byte for
byte. Environment as in transformers' chat template utils: trim_blocks and lstrip_blocks on,
the loopcontrols extension ({% break %}, {% continue %}), a {% generation %} tag that renders
its body, `raise_exception` and `strftime_now` globals, and `tojson` as json.dumps with
ensure_ascii=False (transformers overrides jinja2's own, which escapes HTML characters).
strftime_now uses --date (or the context's "date") instead of the clock so outputs are
reproducible.

One render:  render_chat_template.py TEMPLATE.jinja CONTEXT.json
  CONTEXT.json: {"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool,
                 "bos_token": str, "eos_token": str, "date": "YYYY-MM-DD", "extra": {...}}
  Prints the rendering to stdout; on a template error prints "error: ..." to stderr, exit 3.
Batch:       render_chat_template.py --batch TEMPLATE.jinja CONTEXTS.json
  CONTEXTS.json is a list of contexts; prints a JSON list of {"ok": bool, "text"|"error": str}.
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders the body (transformers' AssistantTracker)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(date):
    # A plain Environment (not transformers' immutable sandbox) so templates may call
    # list.append / dict.pop, as llama.cpp's engine also allows.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[GenerationTag, "jinja2.ext.loopcontrols"])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return date.strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template_text, ctx):
    date = datetime.datetime.strptime(ctx.get("date", "2026-01-15"), "%Y-%m-%d")
    env = make_env(date)
    kwargs = dict(ctx.get("extra", {}))
    kwargs["messages"] = ctx["messages"]
    if ctx.get("tools") is not None:
        kwargs["tools"] = ctx["tools"]
    kwargs["add_generation_prompt"] = bool(ctx.get("add_generation_prompt", False))
    kwargs["bos_token"] = ctx.get("bos_token", "")
    kwargs["eos_token"] = ctx.get("eos_token", "")
    return env.from_string(template_text).render(**kwargs)


def main(argv):
    batch = len(argv) > 1 and argv[1] == "--batch"
    args = argv[2:] if batch else argv[1:]
    if len(args) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(args[0], encoding="utf-8") as f:
        template_text = f.read()
    with open(args[1], encoding="utf-8") as f:
        data = json.load(f)
    if batch:
        results = []
        for ctx in data:
            try:
                results.append({"ok": True, "text": render(template_text, ctx)})
            except Exception as e:  # any template failure counts as "raises"
                results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
        sys.stdout.write(json.dumps(results, ensure_ascii=False))
        return 0
    try:
        sys.stdout.write(render(template_text, data))
    except Exception as e:
        sys.stderr.write(f"error: {type(e).__name__}: {e}\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
