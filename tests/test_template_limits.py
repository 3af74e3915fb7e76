"""Chat templates with limits: every failure is a ChatTemplateError within the time and size
bounds, at construction and at render; a fuzzer of hostile templates keeps the class closed.

``SPECDEC_FUZZ_TEMPLATES`` sets the fuzzer's size (default 200 templates).
"""
import os
import random
import resource
import time
from pathlib import Path

import pytest

from specdec.chat import ChatTemplate, ChatTemplateError, TemplateLimits

LIMITS = TemplateLimits(seconds=1.0, max_chars=1_000_000)
HI = [{"role": "user", "content": "hi"}]
N_TEMPLATES = int(os.environ.get("SPECDEC_FUZZ_TEMPLATES", "200"))
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

HOSTILE = {
    "loop 10**10": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                   "{% endfor %}",
    "a*2e9": "{{ ('a'*2000000000)|length }}",
    "list*2e9": "{{ ([1]*2000000000)|length }}",
    "format padding": "{{ '{:>2000000000}'.format('a') }}",
    "format nested width": "{{ '{:{w}}'.format('a', w=2000000000) }}",
    "percent padding": "{{ '%2000000000s' % 'a' }}",
    "format filter padding": "{{ '%2000000000s'|format('a') }}",
    "10**100000|string": "{{ (10**100000)|string }}",
    "big power": "{{ 2**(2**40) }}",
    "truncate(-1)": "{{ 'abc'|truncate(-1) }}",
    "self-recursive macro": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "doubling ~": "{% set ns = namespace(x='ab') %}{% for i in range(40) %}"
                  "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}",
    "doubling +": "{% set ns = namespace(x='ab') %}{% for i in range(40) %}"
                  "{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}",
    "str.center": "{{ 'a'.center(2000000000) }}",
    "center filter": "{{ 'a'|center(2000000000) }}",
    "str.zfill": "{{ 'a'.zfill(10**10) }}",
    "str.replace": "{% set x = 'a'*100000 %}{{ x.replace('a', x)|length }}",
    "str.join": "{% set x = 'a'*100000 %}{{ x.join(range(10000)|map('string'))|length }}",
    "expandtabs": "{{ ('\t'*100000).expandtabs(100000)|length }}",
    "indent": "{{ ('\n'*100000)|indent(100000) }}",
    "wordwrap": "{{ ('a '*100000)|wordwrap(1, wrapstring='x'*100000)|length }}",
    "output": "{% for i in range(100000) %}{{ 'a'*1000 }}{% endfor %}",
    "macro output": "{% macro m() %}{% for i in range(100000) %}{{ 'a'*1000 }}{% endfor %}"
                    "{% endmacro %}{{ m()|length }}",
    "slice": "{{ [1]|slice(10**9)|list|length }}",
    "batch": "{{ [1]|batch(10**9, 'x')|list|length }}",
    "tojson indent": "{{ range(100)|list|tojson(indent=100000) }}",
    "lipsum": "{{ lipsum(10**9) }}",
    "translate": "{{ 'a'.translate({97: 'b'*100}) }}",
    "deep parentheses": "{{" + "(" * 5000 + "1" + ")" * 5000 + "}}",
    "huge literal": "{{ " + "9" * 50000 + " }}",
    "raise": "{{ raise_exception('no') }}",
    "undefined call": "{{ nothing() }}",
    "division by zero": "{{ 1 // 0 }}",
}
#: the sandbox's own guard: internals read as undefined (an empty string), or refused
ESCAPES = ["{{ ''.__class__.__mro__ }}", "{{ raise_exception.__globals__ }}",
           "{{ cycler.__init__.__globals__ }}", "{{ messages.__class__.__subclasses__() }}"]


def _render(source, limits=LIMITS):
    return ChatTemplate(source, limits=limits).render(HI)


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_a_chat_template_error_within_bounds(name):
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError):
        _render(HOSTILE[name])
    took = time.perf_counter() - t0
    assert took < LIMITS.seconds + 1.5, took
    # nothing near the 2 GB the template asked for was allocated
    assert _rss_mb() - rss0 < 200


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_internals_stay_hidden(source):
    try:
        out = _render(source)
    except ChatTemplateError:
        return
    assert out == ""


def test_limits_are_configurable():
    src = "{% for i in range(n) %}{{ 'ab' }}{% endfor %}"
    assert len(ChatTemplate(src).render(HI, n=3000)) == 6000
    with pytest.raises(ChatTemplateError, match="size limit of 5000"):
        ChatTemplate(src, limits=TemplateLimits(max_chars=5000)).render(HI, n=3000)
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match="0.3 s limit"):
        ChatTemplate(slow, limits=TemplateLimits(seconds=0.3)).render(HI)
    assert time.perf_counter() - t0 < 1.5
    with pytest.raises(ValueError):
        TemplateLimits(seconds=-1)
    with pytest.raises(ValueError):
        TemplateLimits(max_chars=10)


def test_a_timed_out_render_leaves_the_thread_clean():
    """The watchdog's exception never arrives after the render returned."""
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    fast = ChatTemplate("{{ messages[0].content }}", limits=TemplateLimits(seconds=0.05))
    for _ in range(3):
        with pytest.raises(ChatTemplateError):
            ChatTemplate(slow, limits=TemplateLimits(seconds=0.05)).render(HI)
    for _ in range(200):
        assert fast.render(HI) == "hi"
    t_end = time.perf_counter() + 0.3
    while time.perf_counter() < t_end:   # a stray exception would land in this loop
        sum(range(1000))


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.jinja"))[:12], ids=lambda p: p.stem)
def test_real_templates_render_under_the_limits(path):
    talk = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": "Bye"}]
    try:
        out = ChatTemplate(path.read_text(), limits=LIMITS).render(talk)
    except ChatTemplateError as e:
        assert "limit" not in str(e), e   # a template's own refusal, never a limit
        return
    assert "Bye" in out


# --- the fuzzer: random compositions of expensive constructs ------------------------------

_NUMS = ["0", "1", "-1", "7", "100000", "10**6", "2000000000", "10**10", "2**64", "10**100"]
_EXPRS = [
    "'a'*{n}", "[1]*{n}", "'x'.center({n})", "'x'|center({n})", "'%{n}s' % 'a'",
    "'{{:>{n}}}'.format('a')", "'x'.zfill({n})", "range({n})|list|length", "({n})|string",
    "{n}**{n}", "'ab'|truncate({n})", "'a\nb'|indent({n})", "[1,2]|batch({n}, 0)|list",
    "[1,2]|slice({n})|list", "'a b'|wordwrap({n})", "{n} // {n}", "('x'*1000).replace('x', "
    "'y'*{n})", "'-'.join(range(1000)|map('string'))|length", "messages*{n}",
    "(messages|tojson)*{n}", "namespace(v={n}).v", "cycler(1,2).next()", "'x'~{n}",
]
_STMTS = [
    "{{% for i in range({n}) %}}{body}{{% endfor %}}",
    "{{% if {n} > 3 %}}{body}{{% else %}}{body}{{% endif %}}",
    "{{% set x = {e} %}}{body}{{{{ x }}}}",
    "{{% macro m(k) %}}{body}{{% if k > 0 %}}{{{{ m(k - 1) }}}}{{% endif %}}{{% endmacro %}}"
    "{{{{ m({n}) }}}}",
    "{{% set ns = namespace(s='ab') %}}{{% for i in range({n}) %}}{{% set ns.s = ns.s ~ ns.s %}}"
    "{{% endfor %}}{body}",
]


def _random_template(rng):
    body = "{{ " + rng.choice(_EXPRS).format(n=rng.choice(_NUMS)) + " }}"
    for _ in range(rng.randint(0, 3)):
        stmt = rng.choice(_STMTS)
        body = stmt.format(n=rng.choice(_NUMS), body=body,
                           e=rng.choice(_EXPRS).format(n=rng.choice(_NUMS)))
    return body


def test_fuzzed_templates_fail_only_as_chat_template_errors():
    rng = random.Random(int(os.environ.get("SPECDEC_FUZZ_SEED", "7")))
    limits = TemplateLimits(seconds=0.5, max_chars=200_000)
    rss0 = _rss_mb()
    counts = {"ok": 0, "error": 0}
    slowest = 0.0
    for i in range(N_TEMPLATES):
        src = _random_template(rng)
        t0 = time.perf_counter()
        try:
            out = ChatTemplate(src, limits=limits).render(HI)
            assert len(out) <= limits.max_chars, src
            counts["ok"] += 1
        except ChatTemplateError:
            counts["error"] += 1
        except BaseException as e:   # anything else escapes the class
            raise AssertionError(f"template {i} {src!r} raised {type(e).__name__}: {e}")
        slowest = max(slowest, time.perf_counter() - t0)
    print(f"\n{N_TEMPLATES} templates: {counts}, slowest {slowest:.2f}s, "
          f"RSS growth {_rss_mb() - rss0:.0f} MB")
    assert slowest < limits.seconds + 1.5
    assert counts["ok"] and counts["error"]
    assert _rss_mb() - rss0 < 300
