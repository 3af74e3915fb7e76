"""Grammars too large for llguidance to compile safely, and choices past its parser's row,
are a ValueError up front; a grammar within the limit compiles whatever stack the calling
thread has.

llguidance's compiler recurses along chains of rules on the stack of the thread that builds
the matcher: a GBNF chain of 5000 rules (``r0 ::= r1 | "a"`` ...) killed the process with
SIGSEGV on a main thread's 8 MB stack (on a thread of 1 MB, a few hundred rules did). A
grammar now defines at most ``MAX_GRAMMAR_RULES`` rules, and the matcher is built on a
thread of its own with a large stack. A JSON schema nested past Python's recursion limit
was a RecursionError. Choices are taken once each: 5000 copies of one failed the request
after its first token (llguidance's row holds at most 2000 items).
"""
import subprocess
import sys
import textwrap

import pytest

import specdec
from specdec.constraint import MAX_CHOICES, MAX_GRAMMAR_RULES

pytest.importorskip("llguidance")


def _gbnf_chain(n):
    return "\n".join(["root ::= r0"] + [f'r{i} ::= r{i + 1} | "a"' for i in range(n)]
                     + [f'r{n} ::= "b"'])


def _lark_chain(n):
    return "\n".join(["start: r0"] + [f'r{i}: r{i + 1} | "a"' for i in range(n)]
                     + [f'r{n}: "b"'])


@pytest.fixture(scope="module")
def dec(tiny_bytes):
    with specdec.Decoder(tiny_bytes, drafter="ngram", n_max=3, n_ctx=128) as d:
        yield d


@pytest.mark.parametrize("kw", [dict(grammar=_gbnf_chain(5000)), dict(lark=_lark_chain(5000))],
                         ids=["gbnf", "lark"])
def test_a_chain_of_rules_past_the_limit_is_refused(dec, kw):
    with pytest.raises(ValueError, match=f"defines 500[12] rules; at most {MAX_GRAMMAR_RULES}"):
        dec.generate("hello", max_tokens=4, **kw)
    assert dec.generate("hello", max_tokens=4, regex="a|b").text == "a"


def test_a_schema_nested_too_deeply_is_a_value_error(dec):
    schema = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ValueError, match="nested too deeply"):
        dec.generate("hello", max_tokens=4, json_schema=schema)


def test_a_chain_at_the_limit_compiles_on_a_thread_with_a_small_stack(tiny_bytes_path):
    # in a subprocess: before the build thread, this was a SIGSEGV
    code = textwrap.dedent(f"""
        import threading, specdec
        from test_grammar_limits import _lark_chain
        dec = specdec.Decoder({tiny_bytes_path!r}, n_ctx=64)
        out = []
        def run():
            try:
                out.append(dec.generate("hello", max_tokens=4,
                                        lark=_lark_chain({MAX_GRAMMAR_RULES} - 5)).text)
            except ValueError as e:    # llguidance may refuse to follow it: not a crash
                out.append("ValueError")
        threading.stack_size(1 << 20)
        t = threading.Thread(target=run)
        t.start()
        t.join()
        print(out)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=__file__.rsplit("/", 1)[0])
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() in ("['a']", "['ValueError']"), (p.stdout, p.stderr[-2000:])


def test_choices_are_taken_once_and_too_many_are_refused_up_front(dec):
    # 5000 copies of one choice failed after the first token (llguidance's row of 2000)
    assert dec.generate("hello", max_tokens=4, choices=["ba"] * 5000).text == "ba"
    many = [f"c{i}" for i in range(MAX_CHOICES + 1)]
    with pytest.raises(ValueError, match=f"at most {MAX_CHOICES} different choices"):
        dec.generate("hello", max_tokens=4, choices=many)
    assert dec.generate("hello", max_tokens=4, choices=many[:-1]).text.startswith("c")
