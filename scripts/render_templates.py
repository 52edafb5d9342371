"""Render chat templates the way Hugging Face transformers does (jinja2's sandbox with
trim_blocks, lstrip_blocks and loop controls; `raise_exception`, `strftime_now`, and a `tojson`
that is json.dumps without ASCII escaping), as the reference for Perch's minijinja rendering.

usage: render_templates.py TEMPLATE_DIR CORPUS.json OUT.json

CORPUS.json: {"bos_token", "eos_token", "conversations": {name: {"messages", "tools"?,
"kwargs"?}}}. OUT.json: {template file: {conversation: {"text": ...} | {"error": ...}}}.
Written from transformers' documented behaviour (chat_template_utils), not copied from it.
"""

import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


class Generation(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant text for training masks; for
    rendering it is its body, as in transformers."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def calls_only(m):
    return not m.get("content") and m.get("tool_calls")


def render(template, ctx):
    """As Perch renders (engine/src/chat/template.rs): a turn that only calls tools has
    content None; a template that fails on that (not by raise_exception) is rendered again
    with "" in its place, as llama.cpp does for templates that need a non-null content."""
    try:
        return template.render(**ctx)
    except TemplateRaised:
        raise
    except Exception:
        if not any(calls_only(m) for m in ctx["messages"]):
            raise
        messages = [dict(m, content="") if calls_only(m) else m for m in ctx["messages"]]
        return template.render(**dict(ctx, messages=messages))


def main():
    template_dir, corpus_path, out_path = map(Path, sys.argv[1:4])
    corpus = json.loads(corpus_path.read_text())
    env = environment()
    out = {}
    for path in sorted(template_dir.glob("*.jinja")):
        results = {}
        try:
            template = env.from_string(path.read_text())
        except Exception as e:  # a template jinja2 itself cannot compile
            out[path.name] = {"__compile__": {"error": f"{type(e).__name__}: {e}"}}
            continue
        for name, conv in corpus["conversations"].items():
            ctx = dict(conv.get("kwargs", {}))
            ctx.update(
                messages=conv["messages"],
                tools=conv.get("tools"),
                add_generation_prompt=True,
                bos_token=corpus["bos_token"],
                eos_token=corpus["eos_token"],
            )
            try:
                results[name] = {"text": render(template, ctx)}
            except TemplateRaised as e:
                results[name] = {"error": f"raised: {e}"}
            except Exception as e:
                results[name] = {"error": f"{type(e).__name__}: {e}"}
        out[path.name] = results
    out_path.write_text(json.dumps(out, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
