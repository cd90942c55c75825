#!/usr/bin/env python3
"""Reference renderings for pdserve's chat template engine, made by Python's
jinja2 exactly as Hugging Face transformers renders chat templates.

Writes, next to this script:
  constructs.jsonl       one small template per line (every construct the
                         engine supports, and the tricky cases), with its
                         render inputs and `rendered` or `error`;
  extra_reference.jsonl  the realistic templates of templates_extra/ rendered
                         over the conversations of conversations.json and
                         extra_conversations.json.

Line fields: name, template (the source for constructs, the file name for
templates), messages, add_generation_prompt, tools, bos_token, eos_token,
kwargs (extra template variables), and `rendered`, or `error` (str() of the
exception) with `error_type` (its class name) and, for syntax errors,
`error_line`.

Environment (transformers' render_jinja_template): jinja2's
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, loopcontrols]); the `tojson` filter is
json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
sort_keys=sort_keys); raise_exception(msg) raises TemplateError(msg);
strftime_now(fmt) formats "now", pinned here to 2024-07-26 12:00:00.
Render variables: messages, tools, documents=None, add_generation_prompt,
bos_token, eos_token, then **kwargs.

Usage: python3 tests/data/chat_templates/make_constructs.py  (jinja2 >= 3.1)
"""

import datetime
import json
import os

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)


class AssistantTracker(Extension):
    """transformers' {% generation %} tag (renders its body in place)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(
            self.call_method("_generation_support"), [], [], body
        ).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, "jinja2.ext.loopcontrols"],
    )

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(format):
        return NOW.strftime(format)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, messages=None, tools=None, add_generation_prompt=True,
           bos_token="", eos_token="", kwargs=None):
    row = {
        "messages": messages if messages is not None else [],
        "add_generation_prompt": add_generation_prompt,
        "tools": tools,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "kwargs": kwargs or {},
    }
    try:
        template = ENV.from_string(source)
        variables = {"bos_token": bos_token, "eos_token": eos_token, **row["kwargs"]}
        row["rendered"] = template.render(
            messages=row["messages"], tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **variables)
    except Exception as e:  # the reference records the error
        row["error"] = str(e)
        row["error_type"] = type(e).__name__
        if isinstance(e, jinja2.exceptions.TemplateSyntaxError):
            row["error_line"] = e.lineno
    return row


CASES = []


def case(group, template, **ctx):
    """A construct case; ctx: messages/tools/add_generation_prompt/bos_token/
    eos_token, anything else becomes a kwarg."""
    special = {k: ctx.pop(k) for k in list(ctx)
               if k in ("messages", "tools", "add_generation_prompt",
                        "bos_token", "eos_token")}
    CASES.append((group, template, special, ctx))


# ----------------------------------------------------------------- whitespace
W = "whitespace"
case(W, "{% if true %}\nyes\n{% endif %}\nafter")
case(W, "  {% if true %}\n  yes\n  {% endif %}\nafter")
case(W, "a  {% if true %}b{% endif %}  c")
case(W, "line\n    {% if true %}x{% endif %}\n")
case(W, "{%- if true -%}  x  {%- endif -%}  y")
case(W, "  {%+ if true %}x{% endif %}")
case(W, "{% if true +%}\nx{% endif %}")
case(W, "{% if true %}   \nx{% endif %}")
case(W, "{{ 'a' }}\n{{ 'b' }}\n")
case(W, "  {{ 'a' }}  \n  {{ 'b' }}")
case(W, "x {{- 'a' -}} \n y")
case(W, "{{- 'a' -}}  \n  {{ 'b' }}")
case(W, "  {# comment #}\nx")
case(W, "a {#- comment -#}  b")
case(W, "a\n  {#- c #}\nb")
case(W, "a {# c #}\nb")
case(W, "{% raw %}{{ x }}{% if %}{% endraw %}")
case(W, "  {% raw %}\n  {{ x }}\n  {% endraw %}\nz")
case(W, "a {%- raw -%}  {{ b }}  {%- endraw -%} c")
case(W, "\t{% for i in [1, 2] %}\n\t{{ i }}\n\t{% endfor %}\n")
case(W, "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n")
case(W, "x\n")
case(W, "x\n\n")
case(W, "x {% if true %}y{% endif %}")
case(W, "{{ 'a' }}  {% if true %}b{% endif %}")
case(W, "{%- set x = 1 %}\n\n  {{- x }}")
case(W, "{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}",
     messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
case(W, "{% for i in range(3) -%}\n  {{ i }}\n{%- endfor %}")
case(W, "{% for i in range(3) %}{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}")
case(W, "<s>\n  {%- if true %}\n    [x]\n  {%- endif %}\n</s>")
case(W, "{% macro m() %}\n  body\n{% endmacro %}\n[{{ m() }}]")
case(W, "{% set x %}\n  inner\n{% endset %}\n[{{ x }}]")
case(W, "   {%- if true %}a{% endif %}")
case(W, "\n\n{%- if true -%}\n\n a \n\n{%- endif -%}\n\n")
case(W, "{{- '  x  ' -}}")
case(W, "a\n{#- only comment -#}\n\nb")
case(W, " \t {% if true %}tab{% endif %}")
case(W, "{% if true %}{% if true %}\n{% endif %}\n{% endif %}\nend")

# --------------------------------------------------------------- printing
P = "print"
case(P, "{{ [1, 'a', none, true, false, 1.5] }}")
case(P, "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}")
case(P, "{{ (1,) }} {{ () }} {{ (1, 2) }} {{ ((1, 2),) }}")
case(P, "{{ none }} {{ true }} {{ false }} {{ True }} {{ None }}")
case(P, "{{ 0.1 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 2.0 }} {{ 1/3 }} {{ -0.0 }}")
case(P, "{{ 1.5e300 }} {{ 10/4 }} {{ 3.14159 }} {{ 100.0 }} {{ 123456789.123456789 }}")
case(P, "{{ 0.0001 }} {{ 0.00001 }} {{ 1e400 }} {{ -1e400 }} {{ 1e22 }} {{ 12345678901234567.0 }}")
case(P, "{{ 1.0e-10 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }} {{ 0.3 - 0.1 }}")
case(P, "{{ [\"it's\", 'a\"b', 'both\\'\"'] }}")
case(P, "{{ ['\\n', '\\t', '\\\\', '\u00e9', '\\x00', '\\x7f', '\u2028', '\u00a0', '\U0001F600'] }}")
case(P, "{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ {'a': 1}.values() }}")
case(P, "{{ x }}", x={"z": 1, "a": [True, None, 2.5], "m": "q"})
case(P, "{{ x }} {{ x[0] }}", x=[1, "two", 3.0])
case(P, "{{ 'a', 'b' }}")
case(P, "{% print 'p', 1 %}")
case(P, "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_0.5 }} {{ 1e3 }} {{ 2E-3 }}")
case(P, "{{ '\\u00e9\\x41\\101\\n|' }}{{ \"\\t\\\"\" }}{{ 'a' 'b' \"c\" }}")
case(P, "{{ '\\d\\q' }}")
case(P, "{{ n }} {{ f }} {{ b }} {{ s }}", n=42, f=2.5, b=False, s="str")
case(P, "{{ big }} {{ neg }} {{ fl }}", big=9007199254740993, neg=-17, fl=1e-7)

# ------------------------------------------------------------- arithmetic
A = "arith"
case(A, "{{ 5 / 2 }} {{ 5 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }}")
case(A, "{{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2.0 }}")
case(A, "{{ 'a' * 3 }} {{ 3 * 'a' }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }}")
case(A, "{{ 10 / 5 }} {{ 5 % 3.0 }} {{ 2 ** 0.5 }} {{ true + 1 }} {{ true * 'ab' }} {{ 'x' ~ [1, 2] }}")
case(A, "{{ 'ab' * 0 }}|{{ 'ab' * -2 }}|{{ (1, 2) * 2 }}|{{ (1,) + (2,) }}")
case(A, "{{ 1 // 0 }}")
case(A, "{{ 1 / 0 }}")
case(A, "{{ 1 % 0 }}")
case(A, "{{ 1.0 // 0 }}")
case(A, "{{ 'a' + 1 }}")
case(A, "{{ 1 + 'a' }}")
case(A, "{{ -'a' }}")
case(A, "{{ [1] + 'a' }}")
case(A, "{{ 'a' * 'b' }}")
case(A, "{{ 'a' * 1.5 }}")
case(A, "{{ {} + {} }}")
case(A, "{{ [1] - [1] }}")
case(A, "{{ (1,) + [2] }}")
case(A, "{{ 0 ** -1 }}")
case(A, "{{ '%s-%d' % ('a', 3) }} {{ '%05.2f' % 3.14159 }} {{ '%x' % 255 }} {{ '%(a)s' % {'a': 1} }}")
case(A, "{{ '%s' % none }} {{ '%r' % 'q' }} {{ '%5s|%-5s|' % ('a', 'b') }} {{ '%+d % d' % (3, 4) }}")
case(A, "{{ '%.3e' % 12345.678 }} {{ '%g' % 0.00001234 }} {{ '%c' % 65 }} {{ '%%' % () }} {{ '%i' % 3.9 }}")
case(A, "{{ '%#x|%#X|%#o|%#5x|%-#6o|%#08x' % (255, 255, 8, 10, 9, 255) }}")
case(A, "{{ 'abc' % 5 }}")
case(A, "{{ '%d' % 'x' }}")
case(A, "{{ '%s %s' % ('a',) }}")
case(A, "{{ 9223372036854775807 + 0 }} {{ -9223372036854775807 - 1 }}")
case(A, "{{ 7 // 2.0 }} {{ -7 // 2.0 }} {{ 7 % 2.5 }} {{ 2.0 ** 3 }} {{ 4 ** 0.5 }}")
case(A, "{{ +3 }} {{ -(-3) }} {{ +true }} {{ -true }} {{ -1.5 }}")
case(A, "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }}")
case(A, "{{ 'a' ~ 1 + 2 }}")
case(A, "{{ 1 + 2 ~ 'a' }}")

# ------------------------------------------------------------- comparison
C = "compare"
case(C, "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ (1, 2) <= (1, 2) }}")
case(C, "{{ 1 == 1.0 }} {{ 1 == true }} {{ '1' == 1 }} {{ none == none }} {{ [1] == [1] }} {{ (1,) == [1] }}")
case(C, "{{ {'a': 1} == {'a': 1} }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ 1 != 2 }} {{ 'a' != 'a' }}")
case(C, "{{ 1 < 'a' }}")
case(C, "{{ [1] < 'a' }}")
case(C, "{{ none < 1 }}")
case(C, "{{ 'a' in 'abc' }} {{ 1 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'x' not in 'abc' }} {{ 3 not in [1] }}")
case(C, "{{ 1 in 'abc' }}")
case(C, "{{ 'a' in none }}")
case(C, "{{ 'a' in 5 }}")
case(C, "{{ [1] in {'a': 1} }}")
case(C, "{{ 0 or 'b' }} {{ 'a' and 'b' }} {{ none or [] }} {{ not 0 }} {{ '' or none }} {{ 1 and 0 }}")
case(C, "{{ 'ab' > 'aa' }} {{ 'B' < 'a' }} {{ 'é' > 'z' }} {{ 2 >= 2.0 }} {{ 1.5 > 1 }}")
case(C, "{{ [1, [2]] == [1, [2]] }} {{ [1, 2] > [1] }} {{ [] < [0] }}")
case(C, "{{ x in y }}", x="b", y=["a", "b"])
case(C, "{{ 'a' in x }}")
case(C, "{{ x in 'abc' }}")

# --------------------------------------------------------- strings, slicing
S = "strings"
case(S, "{{ 'hello'[0] }} {{ 'hello'[-1] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[::2] }}")
case(S, "[{{ 'hello'[10] }}] {{ 'hello'[-10:] }} {{ 'hello'[:-2] }} {{ 'hello'[3:1] }}|")
case(S, "{{ 'h\u00e9llo'[1:3] }} {{ '\u4eca\u5929'[1] }} {{ '\U0001F600a'|length }} {{ '\u00e9t\u00e9'[::-1] }}")
case(S, "{{ [1, 2, 3, 4][1:-1] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3, 4][3:0:-1] }} {{ (1, 2, 3)[1:] }}")
case(S, "{{ [1, 2, 3][5:] }} {{ [1, 2, 3][-100:100] }} {{ [1, 2, 3, 4, 5][::-2] }}")
case(S, "{{ 'abc'[::0] }}")
case(S, "[{{ 'abc'['a':] }}] [{{ none[1:] }}] [{{ {'a': 1}[1:] }}]")
# A slice is Python's obj[a:b] at run time (a TypeError for what cannot be
# sliced); only a constant {{ }} is rendered at compile time, where the
# failed slice is Undefined.
case(S, "{{ x[:1] }}", x=None)
case(S, "{{ x[1:] }}", x=5)
case(S, "{{ x[1:] }}", x={"a": 1})
case(S, "{{ x.keys()[1:] }}", x={"a": 1})
case(S, "{{ (x|unique)[1:] }}", x=[1, 2])
case(S, "{{ x[1:'a'] }}", x="abc")
case(S, "{{ x[1.5:] }}", x=[1, 2])
case(S, "{{ x[true:] }} {{ x[none:1] }}", x=[1, 2])
case(S, "{% set y = none[:1] %}{{ y }}")
case(S, "{% if none[1:] %}y{% endif %}")
case(S, "{{ none[:1].x }}")
case(S, "{{ (none[:1]) ~ 'x' }} {{ [none[:1]] }} {{ 5[1:] is defined }} [{{ [1, 2][1.5:] }}]")
# jinja2's optimizer folds a constant expression whose value has a safe
# repr (the failed slice inside it Undefined); other ones run.
case(S, "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m((true[:-1] is not iterable)) }} {% set y = (0[0:3]|center).casefold() %}{{ y|length }}")
case(S, "{% set y = [none[:1]] %}{{ y }}")
case(S, "{% set y = {'a': (none[:1]|string)} %}{{ y }} {% set z = none[:1] is defined %}{{ z }} {% for c in (5[1:]|string) %}{{ c }}{% endfor %}|")
case(S, "{{ x if false }}|{{ none[:1] if false }}|{{ (none[:1] if false) is defined }}|{{ false and x[1:] }}|{{ true or x }}|{{ (true and none[:1]) is defined }}")
case(S, "{{ none[:1] if true else x }}|{{ (none[1:] and x) ~ 'z' }}")
case(S, "{% set y = none[:1] if true else x %}{{ y }}")
case(S, "{{ 1 if none[:1] else x }}")
case(S, "{{ none[:1] or x }}")
case(S, "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'abcba'.rstrip('ab') }}")
case(S, "{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}")
case(S, "{{ '  a  b  '.split(none, 1) }} {{ ' a b c '.rsplit(none, 1) }} {{ ''.split() }} {{ ''.split(',') }}")
case(S, "{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }}")
case(S, "{{ 'a'.split('') }}")
case(S, "{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith('l', 2) }}")
case(S, "{{ 'hello'.startswith(1) }}")
case(S, "{{ 'hello world'.upper() }} {{ 'HeLLo'.lower() }} {{ \"they're bill's\".title() }} {{ 'hELLO wORLD'.capitalize() }} {{ 'aBc'.swapcase() }}")
case(S, "{{ 'stra\u00dfe'.upper() }} {{ '\u00c9COLE'.lower() }} {{ '\u00e9cole'.title() }} {{ '\u01c6a'.capitalize() }}")
case(S, "{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.replace('', '-') }} {{ 'abc'.replace('', '-', 2) }}")
case(S, "{{ '{} + {} = {}'.format(1, 2, 3) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='x') }}")
case(S, "{{ '{:>5}|{:<5}|{:^5}|{:*^7}'.format('a', 'b', 'c', 'd') }} {{ '{:05d} {:,} {:.2f} {:.2%} {:x} {:#b}'.format(-3, 1234567, 3.14159, 0.25, 255, 5) }}")
case(S, "{{ '{!r} {:e} {:g} {:.3} {:5} {}'.format('a', 1.5, 1.5e20, 1.0, 3, none) }}")
case(S, "{{ '{0[a]} {0[b][1]}'.format({'a': 1, 'b': [1, 2]}) }}")
case(S, "{{ '{}{}'.format(1) }}")
case(S, "{{ '{:d}'.format('a') }}")
case(S, "{{ '-'.join(['a', 'b']) }} {{ ''.join('abc') }} {{ ', '.join(x) }}", x=["p", "q"])
case(S, "{{ '-'.join([1, 2]) }}")
case(S, "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ 'hello'.index('e') }} {{ 'h\u00e9llo'.find('l') }}")
case(S, "{{ 'hello'.index('z') }}")
case(S, "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' \\t'.isspace() }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} {{ 'Hello World'.istitle() }} {{ 'a1'.isalnum() }} {{ ''.isdigit() }}")
case(S, "{{ '\u00b2'.isdigit() }} {{ '\u00b2'.isdecimal() }} {{ '\u4e00'.isalpha() }} {{ 'A1'.isupper() }} {{ '1'.islower() }} {{ 'x_1'.isidentifier() }}")
case(S, "[{{ 'ab'.center(6) }}] [{{ 'ab'.ljust(5, '.') }}] [{{ 'ab'.rjust(5) }}] [{{ '-42'.zfill(6) }}] [{{ 'abc'.center(2) }}]")
case(S, "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }}")
case(S, "{{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'ABC'.casefold() }}")
case(S, "{{ 'abc'.nope }}|{{ 'abc'.upper is defined }}|")
case(S, "{{ 'abc'.nope() }}")
case(S, "{{ 'abc'['upper']() }} {{ 'abc'.upper()|length }}")
case(S, "{{ x.strip().split('\\n')|length }}", x="  a\nb\nc  ")

# ---------------------------------------------------------------- filters
F = "filters"
case(F, "[{{ '  x  '|trim }}] [{{ 'xxyxx'|trim('x') }}] [{{ 5|trim }}]")
case(F, "{{ 'abc'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ x|length }} {{ '\u00e9\U0001F600'|length }}")
case(F, "{{ 5|length }}")
case(F, "{{ [1,2]|select|length }}")
case(F, "{{ 'Hello'|upper }} {{ 'Hello'|lower }} {{ \"they're bill's (cool) [x] {y} <z> a-b\"|title }} {{ 'hELLO'|capitalize }}")
case(F, "{{ 'aXbX'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 1) }} {{ 123|replace('2', 'x') }}")
case(F, "{{ [1, 2, 3]|join(', ') }} {{ ['a', none]|join }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('.') }}",
     users=[{"name": "a"}, {"name": "b"}])
case(F, "{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ 0|d('z', true) }} {{ 1|d('z') }}")
case(F, "{{ [1, 2]|first }} {{ [1, 2]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}] [{{ []|last }}] {{ {'a': 1, 'b': 2}|first }}")
case(F, "{{ [3, 1]|select|first }}")
case(F, "{{ [3, 1]|select|last }}")
case(F, "{{ 'a'|string }} {{ 1|string }} {{ [1]|string }} {{ none|string }} {{ (1.0)|string }}")
case(F, "{{ '42'|int }} {{ '42.9'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} {{ '0x1f'|int(0, 16) }} {{ 'ff'|int(base=16) }} {{ ' 7 '|int }} {{ '1_000'|int }} {{ true|int }} {{ none|int }}")
case(F, "{{ '1.5'|float }} {{ 'x'|float }} {{ 'x'|float(2.5) }} {{ 3|float }} {{ '1e3'|float }} {{ ' 2 '|float }} {{ 'inf'|float }} {{ 'nan'|float }}")
case(F, "{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ (1, 2)|list }} {{ x|list }}")
case(F, "{{ {'a': 1, 'b': 2}|items|list }} {% for k, v in {'x': 1}|items %}{{ k }}={{ v }}{% endfor %} {{ x|items|list }}")
case(F, "{{ [1, 2]|items|list }}")
case(F, "{{ users|selectattr('active')|map(attribute='name')|list }} {{ users|rejectattr('active')|map(attribute='name')|list }}",
     users=[{"name": "a", "active": True}, {"name": "b", "active": False}, {"name": "c"}])
case(F, "{{ users|selectattr('role', 'equalto', 'user')|list|length }} {{ users|selectattr('role', '==', 'x')|list }} {{ users|selectattr('age', 'gt', 3)|map(attribute='role')|list }}",
     users=[{"role": "user", "age": 5}, {"role": "x", "age": 2}, {"role": "user", "age": 9}])
case(F, "{{ users|selectattr('missing', 'defined')|list }} {{ users|selectattr('a.b')|list }} {{ users|rejectattr('a', 'none')|list }}",
     users=[{"a": {"b": 1}}, {"a": None}, {"a": {"b": 0}}])
case(F, "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 5, 10]|select('>', 3)|list }} {{ [1, 2, 3]|select('in', [1, 3])|list }}")
case(F, "{{ ['a', 'b']|map('upper')|list }} {{ ['1', '2']|map('int')|list }} {{ [[1], [2, 3]]|map('length')|list }} {{ users|map(attribute='x', default='?')|list }} {{ [' a ']|map('trim')|join }}",
     users=[{"x": 1}, {}])
case(F, "{{ [1.234, 2.5]|map('round', 1)|list }} {{ ['a b']|map('replace', ' ', '_')|list }}")
case(F, "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 5|round }} {{ 15|round(-1) }} {{ 1234.5678|round(-2) }} {{ -2.5|round }} {{ 3|round(1, 'ceil') }}")
case(F, "{{ 'x'|round }}")
case(F, "{{ 1|round(1, 'up') }}")
case(F, "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}|{{ ''|indent(first=true) }}|")
case(F, "{{ 'a\\r\\nb\\u2028c'|indent(1) }}")
# indent and truncate take what is not a string as Python does: `s += "\n"`,
# len(s), s[:n] (a message's content may be null or a list of parts).
case(F, "{{ x|indent }}")
case(F, "{{ x|indent(2) }}", x=None)
case(F, "{{ x|indent }}", x=[{"type": "text", "text": "a"}])
case(F, "{{ (1, 2)|indent }}")
case(F, "{{ x|indent }}", x={"a": 1})
case(F, "{{ x|indent }}", x=7)
case(F, "{{ x|truncate }}", x=None)
case(F, "{{ x|truncate(5) }} {{ x|truncate(5)|length }} {{ y|truncate(3) }}", x={"b": 2, "a": 1}, y=[1, 2])
case(F, "{{ x|truncate(5) }}", x=list(range(11)))
case(F, "{{ x|truncate(5, true) }}", x=list(range(11)))
case(F, "{{ x|truncate(5) }}", x={str(i): i for i in range(11)})
case(F, "{{ (x|truncate(5)).partition(',') }}")
case(F, "{{ x|reverse }}", x=None)
case(F, "{{ '<b>'|safe }} {{ 5|safe }} {{ '<a href=\"x\">&\\'</a>'|e }} {{ '<x>'|escape }} {{ '<p>'|forceescape }}")
case(F, "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'a': 3}|dictsort(by='value') }} {{ {'b': 1, 'A': 2}|dictsort(true) }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}")
case(F, "{{ {'a': 1}|dictsort(by='x') }}")
case(F, "{{ [3, 1, 2, 1]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ ['a', 'A']|unique(true)|list }} {{ users|unique(attribute='g')|map(attribute='n')|list }}",
     users=[{"g": 1, "n": "a"}, {"g": 2, "n": "b"}, {"g": 1, "n": "c"}])
case(F, "{{ [[1], [1]]|unique|list }}")
case(F, "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ (1, 2)|reverse|list }} {{ {'a': 1, 'b': 2}|reverse|list }} {{ [1, 2]|select|reverse }}")
case(F, "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'a', 'B']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='n')|list }} {{ users|sort(attribute='age,n', reverse=true)|map(attribute='n')|list }}",
     users=[{"age": 3, "n": "c"}, {"age": 1, "n": "a"}, {"age": 3, "n": "b"}])
case(F, "{{ [1, 'a']|sort }}")
case(F, "{{ [(2, 'b'), (1, 'z'), (2, 'a')]|sort }} {{ [[2], [1, 5], [1]]|sort }}")
case(F, "{{ -3|abs }} {{ -2.5|abs }} {{ (-3)|abs }} {{ true|abs }}")
case(F, "{{ 'a'|abs }}")
case(F, "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} {% for row in [1, 2, 3]|batch(2) %}[{{ row|join }}]{% endfor %}")
case(F, "{{ [1, 2, 3, 4, 5]|slice(2)|list }} {{ [1, 2, 3, 4]|slice(3, 0)|list }}")
case(F, "{{ 'one two  three'|wordcount }} {{ 'a-b c_d \u00e9t\u00e9'|wordcount }} {{ ''|wordcount }}")
case(F, "[{{ 'abc'|center(9) }}] [{{ 'ab'|center(7) }}] [{{ 'abcd'|center(2) }}]")
case(F, "{{ 'Hello world, this is long'|truncate(12) }}|{{ 'Hello world, this is long'|truncate(12, true) }}|{{ 'short'|truncate(10) }}|{{ 'Hello world foo'|truncate(11, false, '..', 0) }}|{{ 'abcdefghij'|truncate(5, leeway=0) }}")
case(F, "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A', 'c']|min }} {{ ['b', 'A', 'c']|max(case_sensitive=true) }} {{ users|max(attribute='a')|tojson }} [{{ []|min }}]",
     users=[{"a": 1}, {"a": 3}, {"a": 2}])
case(F, "{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ users|sum(attribute='a') }} {{ [1, 2]|sum(start=10) }} {{ [[1], [2]]|sum(start=[]) }}",
     users=[{"a": 1}, {"a": 3}])
case(F, "{{ '<p>Hello <b>World</b></p> &amp; <!-- c --> x'|striptags }}|{{ 'a\\n\\n  b'|striptags }}")
case(F, "{{ '%s and %s'|format('a', 'b') }} {{ '%(x)s!'|format(x=1) }} {{ '%.2f'|format(1.2345) }}")
case(F, "{{ {'a': 1}|attr('a') }}|{{ 'abc'|attr('upper')() }}|{{ {'a': 1}|attr('items')()|list }}")
case(F, "{{ 1000|filesizeformat }} {{ 1|filesizeformat }} {{ 1536|filesizeformat(true) }} {{ 12345678|filesizeformat }} {{ 999|filesizeformat }}")
case(F, "{{ x|upper }}|{{ x|string }}|{{ x|first }}|{{ x|join(',') }}|{{ x|trim }}|{{ x|list }}|{{ x|sum }}|{{ x|count }}|{{ x|sort }}|{{ x|selectattr('a')|list }}|{{ x|map('upper')|list }}|{{ x|unique|list }}")
case(F, "{{ x|int }}")
case(F, "{{ x|float }}")
case(F, "{{ x|round }}")
case(F, "{{ x|abs }}")
case(F, "{{ x|dictsort }}")
case(F, "{{ x|tojson }}")
case(F, "{{ [1, 2]|nosuchfilter }}")
case(F, "{% if false %}{{ x|nosuchfilter }}{% endif %}ok")
case(F, "{% if true %}{{ x|nosuchfilter }}{% endif %}ok")
case(F, "{{ x|nosuchfilter if false else 'ok' }}")
case(F, "{% filter upper %}hello {{ 'world' }}{% endfilter %} {% filter replace('a', 'b')|upper %}banana{% endfilter %}")
case(F, "{{ [1, 2]|map('nosuch')|list }}")
case(F, "{{ users|map(attribute='a.0')|list }} {{ users|map(attribute=0)|list }}", users=[[1], [2, 3]])
case(F, "{{ users|map(attribute='a.0')|list }}", users=[{"a": [5]}, {"a": [6, 7]}])

# ------------------------------------------------------------------ tests
T = "tests"
case(T, "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is none }} {{ none is defined }}")
case(T, "{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 1 is float }}")
case(T, "{{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}")
case(T, "{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ x is sequence }}")
case(T, "{{ [] is iterable }} {{ 'a' is iterable }} {{ {} is iterable }} {{ 1 is iterable }} {{ x is iterable }} {{ none is iterable }} {{ ([1]|select) is iterable }}")
case(T, "{{ range is callable }} {{ 'a'.upper is callable }} {{ 1 is callable }} {{ x is callable }} {{ namespace is callable }}")
case(T, "{{ 1 is equalto 1 }} {{ 1 is == 1 }} {{ 1 is eq 2 }} {{ 1 is ne 2 }} {{ 1 is != 1 }} {{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }}")
case(T, "{{ 3 is odd }} {{ 3 is even }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 3.0 is odd }}")
case(T, "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '1' is upper }} {{ 'A1' is upper }}")
case(T, "{{ none is sameas none }} {{ true is sameas true }} {{ 1 is sameas true }} {{ x is sameas x }} {{ [] is sameas [] }}")
case(T, "{{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 3 is lt 2 }} {{ 3 is le 3 }} {{ 3 is greaterthan 4 }} {{ 3 is lessthan 4 }} {{ 3 is > 2 }}")
case(T, "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ 'tojson' is filter }}")
case(T, "{{ x is not defined }} {{ 1 is not none }} {{ not x is defined }} {{ (x is defined) and x }}")
case(T, "{{ 'a' is odd }}")
case(T, "{{ x is odd }}")
case(T, "{{ 1 is nosuchtest }}")
case(T, "{{ 1 is divisibleby 0 }}")
case(T, "{{ x.y is defined }}")
case(T, "{{ d.y is defined }} {{ d.k is defined }} {{ d['k'] is string }}", d={"k": "v"})

# ------------------------------------------------------------------ loops
L = "loops"
case(L, "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}")
case(L, "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}")
case(L, "{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }} {% endfor %}")
case(L, "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}")
case(L, "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case(L, "{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}")
case(L, "{% for x in [] %}{{ x }}{% else %}empty{% endfor %} {% for x in [1] if false %}{% else %}filtered{% endfor %} {% for x in [1] %}{{ x }}{% else %}no{% endfor %}")
case(L, "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %} {% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}")
case(L, "{% for c in 'h\u00e9!' %}[{{ c }}]{% endfor %} {% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}")
case(L, "{% for a, b in [[1, 2], [3]] %}{{ a }}{% endfor %}")
case(L, "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}")
case(L, "{% for a, b in [1] %}{{ a }}{% endfor %}")
case(L, "{% for x in none %}{% endfor %}")
case(L, "{% for x in 5 %}{% endfor %}")
case(L, "{% for x in undefined_thing %}{{ x }}{% else %}none{% endfor %}")
case(L, "{% for row in [[1, 2], [3, 4]] %}{% for c in row %}{{ loop.index }}.{{ c }} {% endfor %}| {% endfor %}")
case(L, "{% for row in [[1, 2], [3]] %}{% set outer = loop %}{% for c in row %}{{ outer.index }}-{{ loop.index }} {% endfor %}{% endfor %}")
case(L, "{% for item in tree recursive %}{{ item.name }}{% if item.children %}({{ loop(item.children) }}){% endif %}@{{ loop.depth }}{{ loop.depth0 }} {% endfor %}",
     tree=[{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}, {"name": "d"}])
case(L, "{% for x in [1, 1, 2, 3, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}")
case(L, "{% for x in [1, 2] %}{{ loop(x) }}{% endfor %}")
case(L, "{% for x in range(3) %}{% for y in range(3) %}{% if y == 1 %}{% break %}{% endif %}{{ x }}{{ y }} {% endfor %}{% endfor %}")
case(L, "{% set items = [3, 1, 2] %}{% for x in items|sort %}{{ x }}{% endfor %}{% for x in items|select('>', 1) %}{{ x }}{% endfor %}")
case(L, "{% set g = [1, 2, 3]|select %}{% for x in g %}{{ x }}{% endfor %}|{% for x in g %}{{ x }}{% endfor %}|{{ g|list }}")
case(L, "{% for m in messages %}{{ loop.index0 }}:{{ m['role'] }}{% if not loop.last %},{% endif %}{% endfor %}",
     messages=[{"role": "user"}, {"role": "assistant"}, {"role": "user"}])
case(L, "{% for x in range(3) %}{{ loop.revindex }}{% endfor %} {{ range(2, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}")
case(L, "{{ range(100001)|length }}")
case(L, "{{ range(1, 2, 0)|list }}")
case(L, "{% for x in range(3) %}{% set x = x * 10 %}{{ x }} {% endfor %}")
case(L, "{% for x in 'ab' %}{{ loop }}{% endfor %}")

# ------------------------------------------------------------ set / scope
V = "set"
case(V, "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }} {% endfor %}{{ x }}")
case(V, "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}")
case(V, "{% for i in [1] %}{% set y = 5 %}{% endfor %}[{{ y }}]")
case(V, "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 9 %}{{ x }} {% endfor %}{{ x }}")
case(V, "{% for i in [1, 2] %}{% if loop.first %}{% set s = 'first' %}{% endif %}[{{ s }}]{% endfor %}")
case(V, "{% set ns = namespace(total=0, items=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.total }} {{ ns.items }}")
case(V, "{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }} [{{ ns.b }}] {{ ns }}")
case(V, "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {{ ns['a'] }}")
case(V, "{% set d = {} %}{% set d.x = 1 %}")
case(V, "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set (c, d) = [3, 4] %}{{ c }}{{ d }} {% set e = 1, 2 %}{{ e }}")
case(V, "{% set a, b = 1 %}")
case(V, "{% set x %}Hello {{ 'world' }}{% endset %}[{{ x }}] {% set y | upper %}up{% endset %}{{ y }} {% set z | trim | replace('a', 'o') %}  cat  {% endset %}{{ z }}")
case(V, "{% set x = y %}[{{ x }}]{{ x is defined }}")
case(V, "{% set x = y %}{{ x.attr }}")
case(V, "{{ v }}{% set v = v + 1 %}{{ v }}", v=10)
case(V, "{% set bos_token = 'B' %}{{ bos_token }}", bos_token="<s>")
case(V, "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}] {% with %}{% set q = 1 %}{% endwith %}[{{ q }}]")
case(V, "{% set messages = messages[1:] %}{{ messages|length }}", messages=[{"role": "system"}, {"role": "user"}])
case(V, "{% set true = 1 %}")
case(V, "{% set ns = namespace(x=0) %}{% macro inc() %}{% set ns.x = ns.x + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.x }}")
case(V, "{% block content %}in block {{ 1 + 1 }}{% endblock %} after {% block other scoped %}x{% endblock other %}")
case(V, "{% generation %}gen {{ 'text' }}{% endgeneration %}!")
case(V, "{% set x = [1, 2] %}{% set y = x %}{{ x is sameas y }}")

# ----------------------------------------------------------------- macros
M = "macros"
case(M, "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('a') }} {{ greet('b', 'Hi') }} {{ greet(greeting='Yo', name='c') }}")
case(M, "{% macro f(a, b=a * 2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 5) }}")
case(M, "{% macro f() %}{{ varargs }}|{{ kwargs }}{% endmacro %}{{ f(1, 2, x=3) }}")
case(M, "{% macro f(a) %}{{ a }}{{ varargs|length }}{% endmacro %}{{ f(1, 2, 3) }}")
case(M, "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}")
case(M, "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(b=1) }}")
case(M, "{% macro f(a, b) %}[{{ a }}][{{ b }}]{% endmacro %}{{ f(1) }}")
case(M, "{% macro f(a, b) %}{{ b.x }}{% endmacro %}{{ f(1) }}")
case(M, "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}")
case(M, "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(item, n) each(['x', 'y']) %}{{ n }}={{ item }};{% endcall %}")
case(M, "{% macro f() %}{{ caller() }}{% endmacro %}{{ f() }}")
case(M, "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}")
case(M, "{% macro m() %}X{% endmacro %}{{ m()|lower }} {{ m() ~ m() }} {{ m|string }} {{ m.name }}")
case(M, "{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}")
case(M, "{% macro outer() %}{% macro inner() %}in{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}")
case(M, "{% set v = 'global' %}{% macro show() %}{{ v }}{% endmacro %}{{ show() }}{% set v = 'later' %}{{ show() }}")
case(M, "{% macro f(a=1, b) %}{% endmacro %}")
case(M, "{% macro f(caller) %}{{ caller() }}{% endmacro %}")
case(M, "{% macro f(x) %}{{ x }}{% endmacro %}{{ f(*[1]) }} {{ f(**{'x': 2}) }}")
case(M, "{% macro f() %}{{ kwargs.a }}{% endmacro %}{{ f(a=5) }}")
case(M, "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}")

# -------------------------------------------------------------- undefined
U = "undefined"
case(U, "[{{ x }}] [{{ d.missing }}] [{{ d['missing'] }}] [{{ none.x }}] [{{ [1][5] }}] [{{ 'abc'.nope }}] [{{ loop }}]", d={"a": 1})
case(U, "{{ x.y }}")
case(U, "{{ x['y'] }}")
case(U, "{{ d.missing.y }}", d={"a": 1})
case(U, "{{ d['missing']['y'] }}", d={"a": 1})
case(U, "{{ l[5].x }}", l=[1])
case(U, "{{ none.x.y }}")
case(U, "{{ d[0].x }}", d={"a": 1})
case(U, "{{ x + 1 }}")
case(U, "{{ 1 + x }}")
case(U, "{{ x() }}")
case(U, "{{ x < 1 }}")
case(U, "{{ -x }}")
case(U, "{{ x * 2 }}")
case(U, "{{ [x] }} {{ x == x }} {{ x ~ 'a' }} {{ not x }} {{ x or 'b' }} {{ x and 'b' }} {{ x|default('d') }} {{ x is none }} {{ x in [1] }} {{ 'a' in x }}")
case(U, "{{ '%s|' % x }}{{ x|e }}")
case(U, "{{ x.__class__ }}|{{ ''.__class__ }}|{{ [].append }}|{{ {}.update }}|")
case(U, "{{ [1].append(2) }}")
case(U, "{{ {}.update({'a': 1}) }}")
case(U, "{{ d.pop('a') }}", d={"a": 1})
case(U, "{% set l = [1] %}{{ l.sort() }}")
case(U, "{{ 'a' if false }}|{{ ('a' if false).x }}")
case(U, "{{ ('a' if false) + 1 }}")
case(U, "{{ loop.index }}")
case(U, "{% for x in [1] %}{{ loop.nope }}|{{ loop.nope.x }}{% endfor %}")
case(U, "{% set ns = namespace() %}{{ ns.nope.x }}")
case(U, "{{ x.y if x is defined else 'fallback' }} {{ (x or {}).y }}")
case(U, "{{ messages[0].content }}", messages=[])
case(U, "{{ messages[0]['role'] == 'system' }}", messages=[])
case(U, "{{ [1, 2][1.5] }}|{{ 'ab'[none] }}|{{ {'a': 1}[[1]] }}|")
case(U, "{{ raise_exception('Custom failure: ' ~ 42) }}")
case(U, "before{{ raise_exception('x') }}after")
case(U, "{% if messages|length == 0 %}{{ raise_exception('No messages!') }}{% endif %}ok", messages=[])

# -------------------------------------------------------------- dict / json
D = "dicts"
case(D, "{{ d.get('a') }} {{ d.get('x') }} {{ d.get('x', 'def') }} {{ d.keys()|list }} {{ d.values()|list }} {{ 'a' in d.keys() }} {{ d|length }}",
     d={"a": 1, "b": 2})
case(D, "{{ d.items is callable }} {{ d['items'] }} {{ d.content }} {{ d['get'] }}", d={"items": "I", "content": "C", "get": "G"})
case(D, "{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in d.items()|sort(attribute='1') %}{{ k }}{% endfor %}",
     d={"b": 2, "a": 3, "c": 1})
case(D, "{{ {1: 'a', 'b': 2}[1] }} {{ {1: 'a'}[1.0] }} {{ {true: 'x'}[1] }} {{ {(1, 2): 'tuple'}[(1, 2)] }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ dict({'m': 1}, n=2) }}")
case(D, "{{ {'a': 1, 'a': 2} }} {{ {'a': 1, }|length }} {{ [1, 2, ]|length }} {{ d.copy() }}", d={"k": [1]})
case(D, "{{ tools|tojson }}", tools=[{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])
case(D, "{{ x|tojson(indent=2) }}|{{ x|tojson(indent=4) }}", x={"b": [1, {"c": None}], "a": {}, "e": []})
case(D, "{{ x|tojson(sort_keys=true) }}|{{ x|tojson(separators=(',', ':')) }}|{{ x|tojson(indent='\\t') }}|{{ x|tojson(indent=0) }}",
     x={"b": 1, "a": [1, 2]})
case(D, "{{ x|tojson }}|{{ x|tojson(ensure_ascii=true) }}", x={"t": "\u00e9\u4eca\U0001F600\u2028\x01\x7f\"\\/\n\t\b\f\r"})
case(D, "{{ [1.0, 1e16, 1e-7, 2.5, 0.1, -0.0, 100, true, none, 'x']|tojson }} {{ ('a', 1)|tojson }} {{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}")
case(D, "{{ 'nan'|float|tojson }} {{ 'inf'|float|tojson }} {{ '-inf'|float|tojson }}")
case(D, "{{ {'b': 1, 1: 2}|tojson(sort_keys=true) }}")
case(D, "{{ {(1, 2): 'a'}|tojson }}")
case(D, "{{ [x]|tojson }}")
case(D, "{{ namespace(a=1)|tojson }}")
case(D, "{{ ([1]|select)|tojson }}")
case(D, "{{ {'a': 1}.items()|tojson }}")
case(D, "{{ x|tojson }}", x={"nested": {"deep": [[[{"k": "v"}]]]}, "unicode_key_\u00e9": 1})
case(D, "{{ x|tojson(indent=2, sort_keys=true) }}", x={"b": {"y": 1, "x": [3, {"q": 1, "p": 2}]}, "a": 1})
case(D, "{{ d.x.y }}|{{ d['x']['y'] }}|{{ d.x['y'] }}|{{ d['x'].y }}", d={"x": {"y": "deep"}})
case(D, "{{ messages[0].content[0].text }} {{ messages[0]['content'][1]['type'] }}",
     messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}])

# ------------------------------------------------------- misc expressions
X = "expr"
case(X, "{{ 'a' if x else 'b' }} {{ 'a' if true else 'b' }} {{ 1 if false else 2 if true else 3 }} {{ 'y' if 0 }}|")
case(X, "{{ -1|abs }} {{ 'a' + 'b'|upper }} {{ (('a' + 'b')|upper) }} {{ not x is defined }} {{ [1, 2]|length + 1 }} {{ -[1,2]|length }}")
case(X, "{{ [1, 2].count(1) }} {{ (1, 2, 2).count(2) }} {{ [5, 6].index(6) }} {{ 'abc'.upper().lower() }} {{ [1, 2, 3][1:][0] }}")
case(X, "{{ [1, 2].index(7) }}")
case(X, "{{ [[1, 2], [3]][0][1] }} {{ {'a': {'b': [1, 2, 3]}}['a']['b'][-1] }} {{ x.0 }} {{ x.1 }}", x=["first", "second"])
case(X, "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d') }} {{ strftime_now('%A %B %-d, %H:%M') }}")
case(X, "{% set j = joiner(' | ') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}")
case(X, "{{ 1 is defined if true }}")
case(X, "{{ 'abc' is string and 'abc' | length > 2 }}")
case(X, "{{ (1, 2) }} {{ (1) }} {{ ((1)) }} {{ (1,2)[0] }}")
case(X, "{{ x.real }}", x=5)

# ------------------------------------------------------------ syntax errors
E = "syntax"
case(E, "{% if true %}unclosed")
case(E, "{% for x in y %}{% endif %}")
case(E, "{% nosuchtag %}")
case(E, "{% endfor %}")
case(E, "{{ }}")
case(E, "{{ 1 + }}")
case(E, "{{ 'unterminated }}")
case(E, "{% for x y %}{% endfor %}")
case(E, "{{ foo( }}")
case(E, "{{ a b }}")
case(E, "{% set 1 = 2 %}")
case(E, "{{ [1, 2 }}")
case(E, "{{ {1: } }}")
case(E, "{% break %}")
case(E, "{% macro %}{% endmacro %}")
case(E, "line1\nline2\n{% if %}")
case(E, "{# unclosed comment")
case(E, "{% raw %}unclosed raw")
case(E, "{{ x|upper( }}")
case(E, "{{ 1 is }}")
case(E, "{{ x.1a }}")
case(E, "{% include 'other.jinja' %}")
case(E, "{% do x %}")
case(E, "{{ 1 is defined is defined }}")
case(E, "{{ x | }}")
case(E, "{% if x %}{% else %}{% else %}{% endif %}")
case(E, "{% call foo %}{% endcall %}")

# -------------------------------------------------- chat-template idioms
H = "chat"
MSGS = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
    {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "image"},
                                 {"type": "text", "text": "this?"}]},
]
case(H, "{% for m in messages %}{% if m.content is string %}{{ m.role }}:{{ m.content|trim }}{% else %}{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}{% else %}<{{ c.type }}>{% endif %}{% endfor %}{% endif %}\n{% endfor %}", messages=MSGS)
case(H, "{% for m in messages %}{% if 'tool_calls' in m %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){% endfor %}{% endif %}{% endfor %}", messages=MSGS)
case(H, "{% for m in messages %}{% if m.tool_calls is defined and m.tool_calls %}T{% else %}-{% endif %}{% endfor %}", messages=MSGS)
case(H, "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ (messages|last).role }} {{ messages[-1]['role'] }} {{ messages|map(attribute='role')|join(',') }}", messages=MSGS)
case(H, "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}{{ ns.last_user }}", messages=MSGS)
case(H, "{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %} {% for m in messages|reverse %}{{ loop.index }}{% endfor %}", messages=MSGS)
case(H, "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.content }}{% endfor %}",
     messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], bos_token="<s>")
case(H, "{% if add_generation_prompt %}<|assistant|>{% endif %}{{ eos_token }}", add_generation_prompt=False, eos_token="</s>")
case(H, "{{ tools is none }} {{ tools is defined }} {{ documents is none }} {{ tools|length if tools else 0 }}")
case(H, "{% if tools %}{% for t in tools %}{{ t.function.name }}: {{ t.function.parameters.properties|list }}\n{% endfor %}{% endif %}",
     tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"b": {}, "a": {}}}}}])
case(H, "{{ messages[0].content|trim if messages[0].role == 'system' else 'default' }}", messages=MSGS)
case(H, "{% set content = message.content if message.content is string else message.content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join('') %}{{ content }}", message=MSGS[4])
case(H, "{% if message.content is not string %}{{ message.content|map(attribute='type')|unique|list }}{% endif %}", message=MSGS[4])
case(H, "{{ message.get('reasoning_content', '') }}|{{ message.get('role') }}", message=MSGS[1])
case(H, "{%- if messages[-1].role == 'assistant' and '</think>' in messages[-1].content %}{{ messages[-1].content.split('</think>')[-1].lstrip('\\n') }}{% endif %}",
     messages=[{"role": "assistant", "content": "<think>hmm</think>\n\nAnswer"}])


# ------------------------------------------------------------------ more
R = "more"
case(R, "a {{+ 'b' }} c {{- 'd' +}}")
case(R, "x\n  {%- raw %} r {% endraw -%}  \ny")
case(R, "{# a %} {{ b }} #}{{ '%}' }}{{ '}}' }}{% set x = '%}' %}{{ x }}")
case(R, "{% macro m(a) %}{{ a }}{{ caller(a * 2) }}{{ varargs }}{% endmacro %}{% call(v) m(1, 2, 3) %}<{{ v }}>{% endcall %}")
case(R, "{% for x in [1] %}{{ loop.cycle() }}{% endfor %}")
case(R, "{% set g = [3, 1, 2]|select %}{{ g|first }} {{ g|list }} {{ g|list }}")
case(R, "{{ x == 'a' }} {{ x != 'a' }} {{ 'a' == x }}")
case(R, "{{ '\u00c9COLE'.lower() }} {{ '\u0130'.lower()|length }} {{ 'hello-world foo_bar'.title() }} {{ 'hello-world'|title }}")
case(R, "{{ {'a': 1, 'b': 2, 'a': 3} }} {{ dict(b=1, a=2)|dictsort }}")
case(R, "{{ '{:>{w}}|{:{f}^{w}}'.format('x', 'y', w=5, f='*') }}")
case(R, "{{ '%s' % [1, 2] }} {{ '%s' % ((1, 2),) }} {{ '%d%%' % 50 }} {{ '%.1f%%' % 12.345 }}")
case(R, "{{ '%s %s' % [1, 2] }}")
case(R, "{{ 'abc'|batch(2)|list }} {{ [1, 2, 3]|slice(2)|map('sum')|list }} {{ range(3)|reverse|list }} {{ messages|batch(2)|map('first')|map(attribute='role')|list }}",
     messages=[{"role": "a"}, {"role": "b"}, {"role": "c"}])
case(R, "{% set caf\u00e9 = 1 %}{{ caf\u00e9 }} {% set _x = 2 %}{{ _x }}")
case(R, "{{ not true == false }} {{ 'a' ~ 'b'|upper }} {{ 'a' in 'abc' and true }} {{ x|default('a' if true else 'b') }} {{ dict(a=1,)|length }}")
case(R, "{{ true // 2 }} {{ 'x' * 1000|length }} {{ 0.1 + 0.2 }} {{ 3.0|int }} {{ '3.5'|float|round|int }} {{ (10 / 3)|round(2) }} {{ 1e16|string }}")
case(R, "{% for x in [1, 2, 3] %}{{ loop.revindex0 }}{% endfor %} {{ none|string|upper }} {{ none|lower }} {{ '  -3  '|int }} {{ '1e2'|int }}")
case(R, "{{ strftime_now('%j %U %p %I %y %a %H:%M:%S %%') }}")
case(R, "{{ 'a\\nb'|indent('--', true) }}|{{ 'a\\nb'|indent(width='..', first=true) }}")
case(R, "{{ [1, [2, [3]]]|tojson(indent=1) }}|{{ {'k': {}}|tojson(indent=2) }}|{{ ['\u00e9']|tojson(indent=2, ensure_ascii=true) }}")
case(R, "{{ messages[-1] }}", messages=[{"role": "user", "content": ["a", {"b": None}]}])
case(R, "{% set a = b = 1 %}")
case(R, "{{ .5 }}")
case(R, "{{ 1.5e3 }} {{ 1E3 }} {{ 1_000.000_1 }}")
case(R, "line1\n{% for x in [1] %}\n{{ x.nope.deeper }}\n{% endfor %}")
case(R, "a\n\n{{ 1 +\n}}")
case(R, "{% if true %}\n  {%- for x in [1, 2] %}\n    {{ x }}\n  {%- endfor %}\n{% endif %}\n")
case(R, "{%- for m in messages -%}\n  {%- if loop.first %}[{% endif -%}\n  {{ m }}\n  {%- if not loop.last %}, {% else %}]{% endif -%}\n{%- endfor %}", messages=[1, 2, 3])
case(R, "{{ [1, 2, 3]|map('string')|join('+') }} {{ ['b', 'a']|sort|join }} {{ [3, 2]|sort|first }} {{ {'b': 1, 'a': 2}|dictsort|first }}")
case(R, "{{ 'x'.join(['a', 'b', 'c'])|upper }} {{ ('a' ~ 'b')|length }} {{ ['a', 'b']|join('-')|replace('-', '+') }}")
case(R, "{{ messages|selectattr('content')|list|length }} {{ messages|rejectattr('content')|list|length }} {{ messages|map(attribute='content')|select|list }}",
     messages=[{"content": ""}, {"content": "x"}, {"role": "n"}])
case(R, "{% for k, v in d.items() %}{{ k }}{% if v is mapping %}{{ v|length }}{% elif v is sequence and v is not string %}[{{ v|join(',') }}]{% else %}={{ v }}{% endif %};{% endfor %}",
     d={"s": "str", "l": [1, 2], "m": {"a": 1}, "n": None, "i": 3})
case(R, "{% set ns = namespace(items=[]) %}{% for m in messages %}{% set ns.items = ns.items + [m.role|upper] %}{% endfor %}{{ ns.items|join(' ') }} {{ ns.items|length }}",
     messages=[{"role": "user"}, {"role": "assistant"}])
case(R, "{% macro render(v, depth=0) %}{% if v is mapping %}{% for k in v %}{{ ' ' * depth }}{{ k }}:\n{{ render(v[k], depth + 2) }}{% endfor %}{% else %}{{ ' ' * depth }}{{ v }}\n{% endif %}{% endmacro %}{{ render(d) }}",
     d={"a": {"b": 1, "c": {"d": 2}}, "e": 3})
case(R, "{{ '{\"a\": 1}'|length }} {{ '{{ not a tag }}' }} {{ \"{% also not %}\" }}")
case(R, "{% filter indent(2) %}\nline1\nline2\n{% endfilter %}")
case(R, "{{ loop_var|default('none') }}{% for loop_var in [1] %}{% endfor %}")
case(R, "{% for a in [1, 2] %}{% for b in [3] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}{% endfor %}")
case(R, "{{ [3, 1, 2]|max }} {{ ['aa', 'b']|max(attribute='length') }}")
case(R, "{{ users|map(attribute='name')|map('upper')|join(', ') }} {{ users|sum(attribute='n') }} {{ users|map(attribute='n')|max }}",
     users=[{"name": "a", "n": 2}, {"name": "b", "n": 5}])
case(R, "{{ 5|string|length }} {{ (5|string)[0] }} {{ 12345|string|reverse }} {{ [1, 2]|string }}")
case(R, "{% set x = [1, 2, 3] %}{{ x[1:]|sum }} {{ x[:1] + x[2:] }} {{ x|length > 2 and x[0] == 1 }}")
case(R, "{{ tools[0].function.parameters|tojson(indent=2) }}",
     tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"q": {"type": "string", "enum": ["a", "b"]}}, "required": ["q"]}}}])

case(R, "{{ {1: 'a', 1.0: 'b', true: 'c'} }} {{ {1.5: 'x', none: 'n'}[1.5] }}{{ {none: 'n'}[none] }} {{ {0: 'z', false: 'f'}|length }}")
case(R, "{{ 'h\u00e9llo'[-1] }}{{ 'h\u00e9llo'[1] }}[{{ 'abc'[-4] }}]{{ ('ab' * 3)|reverse }} {{ '\u00e9t\u00e9'|reverse }}")
case(R, "{{ 'abc'|truncate(9223372036854775807) }} {{ 'ab'|center(1) }}")
case(R, "{{ 5|round(-20) }} {{ 123456789|round(-3) }}")

case(R, "{% set ns = namespace(x=0) %}{% set a, ns.x = 1, 2 %}{{ a }}{{ ns.x }} {% set (b, c), d = (1, 2), 3 %}{{ b }}{{ c }}{{ d }}")
case(R, "{% for a, in x %}{{ a }}{% endfor %}", x=[[1, 2]])
case(R, "{% set ns = namespace(x=0) %}{% for ns.x in [1, 2] %}{% endfor %}{{ ns.x }}")
case(R, "{% set a, = [1] %}{{ a }}")


def main():
    out_path = os.path.join(HERE, "constructs.jsonl")
    counts = {}
    with open(out_path, "w", encoding="utf-8") as out:
        for group, template, special, kwargs in CASES:
            counts[group] = counts.get(group, 0) + 1
            row = {"name": f"{group}_{counts[group]:03d}", "template": template}
            row.update(render(template, kwargs=kwargs, **special))
            if " at 0x" in row.get("rendered", ""):
                raise SystemExit(f"{row['name']}: output has a memory address: {row['rendered']}")
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{out_path}: {len(CASES)} cases")
    write_extra()


def write_extra():
    """Renders templates_extra/*.jinja over the conversations."""
    tdir = os.path.join(HERE, "templates_extra")
    if not os.path.isdir(tdir):
        return
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    with open(os.path.join(HERE, "extra_conversations.json"), encoding="utf-8") as f:
        conversations += json.load(f)
    with open(os.path.join(tdir, "tokens.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    out_path = os.path.join(HERE, "extra_reference.jsonl")
    n = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for name in sorted(os.listdir(tdir)):
            if not name.endswith(".jinja"):
                continue
            with open(os.path.join(tdir, name), encoding="utf-8") as f:
                source = f.read()
            stem = name[: -len(".jinja")]
            tok = tokens.get(stem, {})
            for conv in conversations:
                agps = [conv.get("add_generation_prompt", True)]
                if conv["name"] == "multi_turn":
                    agps.append(False)
                for agp in agps:
                    row = {"template": stem, "case": conv["name"] + ("" if agp else "_nogen")}
                    row.update(render(
                        source, messages=conv["messages"], tools=conv.get("tools"),
                        add_generation_prompt=agp, bos_token=tok.get("bos_token", ""),
                        eos_token=tok.get("eos_token", ""),
                        kwargs=conv.get("kwargs")))
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
    print(f"{out_path}: {n} renderings")


if __name__ == "__main__":
    main()
