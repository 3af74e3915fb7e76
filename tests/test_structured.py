"""Structured output: constraints on every entry point, verification and drafting under the
grammar (exact-mode equality with constrained plain decoding, for every built-in drafter),
and bad constraints refused when the request is made."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

import specdec
from specdec import Constraint, Decoder

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "city": {"enum": ["Lyon", "Basel", "Turin"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPT = ("Extract the person as JSON.\nText: Alice Martin, 34, lives in Lyon.\nJSON: ")


@pytest.fixture(scope="module")
def exact_gemma(gemma_path) -> specdec.Model:
    return specdec.Model(gemma_path, use_extra_bufts=False)


def test_constraint_options_are_declared_once():
    assert specdec.constraint.OPTIONS == ("grammar", "json_schema", "regex", "choices", "lark")
    assert Constraint.of({}) is None and Constraint.of({"regex": None}) is None
    assert Constraint.of({"regex": "a+"}).kind == "regex"
    with pytest.raises(TypeError, match="unknown options"):
        Constraint.of({"json_shema": {}})
    with pytest.raises(ValueError, match="one constraint"):
        Constraint.of({"regex": "a", "choices": ["a"]})


@pytest.mark.parametrize("bad, match", [
    ({"grammar": "root ::= ("}, "GBNF"),
    ({"grammar": "root ::= undefined-rule"}, "grammar"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": 3}, "JSON object"),
    ({"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}, "json_schema"),
    ({"regex": "(ab"}, "regex"),
    ({"choices": []}, "non-empty"),
    ({"choices": ["a", ""]}, "non-empty"),
    ({"choices": "ab"}, "list"),
])
def test_bad_constraint_is_a_value_error_when_asked(tiny_bytes, bad, match):
    dec = Decoder(tiny_bytes, n_ctx=256)
    with pytest.raises(ValueError, match=match):
        dec.generate("x", max_tokens=4, **bad)
    with pytest.raises(ValueError, match=match):
        dec.stream("x", max_tokens=4, **bad)
    assert dec.generate("x", max_tokens=3).text == "ab"     # still usable


def test_constraints_on_the_decoder(tiny_bytes):
    dec = Decoder(tiny_bytes, drafter="ngram", n_ctx=512)
    assert dec.generate("x", max_tokens=8, choices=["yes", "no"]).text in ("yes", "no")
    res = dec.generate("x", max_tokens=12, regex=r"[0-9]{3}-[a-c]{2}")
    assert re.fullmatch(r"[0-9]{3}-[a-c]{2}", res.text) and res.finish_reason == "eos"
    res = dec.generate("x", max_tokens=12, grammar='root ::= "H" [a-z]+ "!"')
    assert re.fullmatch(r"H[a-z]+!", res.text) or res.finish_reason == "length"
    res = dec.generate("x", max_tokens=64, json_schema=PERSON)
    jsonschema.validate(json.loads(res.text), PERSON)
    text = "".join(dec.stream("x", max_tokens=64, json_schema=json.dumps(PERSON)))
    jsonschema.validate(json.loads(text), PERSON)
    # the free text the model writes unconstrained is not what the constraint allows
    assert dec.generate("x", max_tokens=8).text == "ab"


def test_pydantic_model_as_schema(gemma):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    dec = Decoder(gemma, drafter="suffix", n_ctx=1024)
    res = dec.generate(PROMPT, max_tokens=48, json_schema=Person)
    assert Person.model_validate_json(res.text).age == 34


def test_chat_takes_constraints(gemma):
    dec = Decoder(gemma, drafter="ngram", n_ctx=1024)
    msgs = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    res = dec.chat(msgs, max_tokens=8, choices=["yes", "no"], chat_template="gemma")
    assert res.text in ("yes", "no") and res.finish_reason == "eos"
    text = "".join(dec.stream_chat(msgs, max_tokens=40, chat_template="gemma", json_schema={
        "type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}))
    assert isinstance(json.loads(text)["answer"], bool)


def test_forced_tokens_are_drafted_and_accepted(gemma):
    """A JSON schema forces its keys and punctuation: they are drafted whatever the drafter
    (here none that ever proposes anything) and accepted."""
    from specdec.drafters import Drafter

    class Never(Drafter):
        def propose(self, seq, last_token, n_max):
            return []

    dec = Decoder(gemma, drafter=Never("never"), n_max=8, n_ctx=1024)
    res = dec.generate(PROMPT, max_tokens=64, json_schema=PERSON)
    jsonschema.validate(json.loads(res.text), PERSON)
    assert res.stats.drafted >= 6, res.stats
    assert res.stats.accepted >= 0.9 * res.stats.drafted
    assert res.stats.rounds < res.stats.n_generated


def _plain_and_spec(model, drafter, constraint, prompt=PROMPT, n_max=6, max_tokens=64,
                    n_ctx=1024):
    plain = Decoder(model, exact=True, n_ctx=n_ctx).generate(prompt, max_tokens=max_tokens,
                                                             **constraint)
    spec = Decoder(model, drafter=drafter, n_max=n_max, exact=True, n_ctx=n_ctx).generate(
        prompt, max_tokens=max_tokens, **constraint)
    return plain, spec


CONSTRAINTS = [{"json_schema": PERSON}, {"choices": ["Alice Martin", "Alice Marton", "Bob"]},
               {"regex": r"[A-Z][a-z]+ [A-Z][a-z]+, [0-9]+"}]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: next(iter(c)))
@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_exact_constrained_speculation_equals_constrained_plain(exact_gemma, drafter,
                                                                constraint):
    plain, spec = _plain_and_spec(exact_gemma, drafter, constraint)
    assert spec.tokens == plain.tokens
    assert spec.finish_reason == plain.finish_reason


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram-map", "ngram-map-k4v", "ngram-cache", "layerskip:9",
                                     "draft:SELF"])
def test_exact_constrained_speculation_every_drafter(exact_gemma, gemma_path, drafter):
    drafter = drafter.replace("SELF", gemma_path)
    for constraint in CONSTRAINTS:
        plain, spec = _plain_and_spec(exact_gemma, drafter, constraint)
        assert spec.tokens == plain.tokens, (drafter, constraint)


def test_exact_constrained_speculation_on_a_synthetic_target(tiny_bytes_path):
    from specdec.benchmark.oracle import Oracle
    tiny_bytes = specdec.Model(tiny_bytes_path, use_extra_bufts=False)
    for constraint in CONSTRAINTS + [{"grammar": 'root ::= "H" [a-z]{2,5} "!" [0-9]+'}]:
        plain, spec = _plain_and_spec(tiny_bytes, "ngram", constraint, prompt="xyz", n_ctx=256)
        assert spec.tokens == plain.tokens
        # a drafter that proposes the plain output (the grammar forces part of it)
        p = tuple(tiny_bytes.tokenize("xyz", add_special=True, parse_special=True))
        oracle = Decoder(tiny_bytes, drafter=Oracle({p: plain.tokens}), n_max=5, exact=True,
                         n_ctx=256).generate("xyz", max_tokens=64, **constraint)
        assert oracle.tokens == plain.tokens
        assert oracle.stats.accepted == oracle.stats.drafted


def test_engine_batch_of_different_constraints(exact_gemma):
    """Requests of different constraints (and none) verified together: each equals its run
    alone (exact mode) and matches its own constraint."""
    reqs = [dict(json_schema=PERSON), dict(choices=["Lyon", "Basel"]),
            dict(regex=r"[0-9]{2,4}"), dict()]
    alone = [Decoder(exact_gemma, drafter="ngram", n_max=4, exact=True, n_ctx=1024).generate(
        PROMPT, max_tokens=40, **c) for c in reqs]
    with specdec.Engine(exact_gemma, drafters=["ngram"], n_max=4, n_slots=4, n_ctx=1024,
                        exact=True) as eng:
        handles = [eng.submit(PROMPT, max_tokens=40, **c) for c in reqs]
        got = [h.result(timeout=300) for h in handles]

        async def streamed():
            st = eng.stream(PROMPT, max_tokens=8, regex="[0-9]+")
            return "".join([p.text async for p in st])
        assert re.fullmatch("[0-9]+", asyncio.run(streamed()))
        with pytest.raises(ValueError):
            eng.submit(PROMPT, max_tokens=4, regex="(")
    for a, b in zip(alone, got):
        assert a.tokens == b.tokens
    jsonschema.validate(json.loads(got[0].text), PERSON)
    assert got[1].text in ("Lyon", "Basel")
    assert re.fullmatch(r"[0-9]{2,4}", got[2].text)


def test_cli_generate_with_a_schema_file(gemma_path, tmp_path, capsys):
    from specdec.cli import main
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(PERSON))
    assert main(["generate", "-m", gemma_path, "-p", PROMPT, "-n", "48", "-q",
                 "--json-schema", str(schema)]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), PERSON)
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    assert main(["generate", "-m", gemma_path, "-p", "Yes or no?", "-n", "4", "-q",
                 "--grammar", str(gbnf)]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")
    assert main(["generate", "-m", gemma_path, "-p", "x", "-n", "4", "-q",
                 "--regex", "(", ]) == 1
    assert "regex" in capsys.readouterr().err


@pytest.mark.parametrize("gbnf, rx", [
    ('root ::= "H" (("i")?)? ([a-c]{1,2}){1,2} "!"', r"Hi?(?:[a-c]{1,2}){1,2}!"),
    ('root ::= (("a"){0,1}){0,2} (("b")+)? x\nx ::= ("c"?)+ "."', r"a{0,2}b*c*\."),
])
def test_gbnf_quantifier_of_a_quantified_group(tiny_bytes, gbnf, rx):
    """llguidance's GBNF converter writes ``(("a")?)?`` as ``"a"??``, which its Lark refuses;
    specdec groups the stacked quantifiers again, and the grammar works."""
    assert "??" not in Constraint(grammar=gbnf).llguidance_grammar()
    for seed in range(4):
        res = Decoder(tiny_bytes, drafter="ngram", n_max=4, n_ctx=256).generate(
            "x", max_tokens=40, grammar=gbnf, sampling={"temperature": 1.0, "seed": seed})
        assert res.finish_reason == "eos" and re.fullmatch(rx, res.text), res.text


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_masked_rows_of_the_head_give_what_whole_rows_give(exact_gemma, drafter):
    """Under a grammar a row that allows few tokens gets only their logits from the lazy
    head (``Context.masked_logits_c``); they are the same bits as a whole row's, so the
    tokens, their logprobs and a seeded sampled answer are those of whole rows masked after
    (``_checks.sparse_head(0)``)."""
    from specdec import _checks

    def run(n):
        old = _checks.sparse_head(n)
        try:
            dec = Decoder(exact_gemma, drafter=drafter, n_max=6, exact=True, n_ctx=1024,
                          lazy_logits=True)
            greedy = dec.generate(PROMPT, max_tokens=48, json_schema=PERSON, logprobs=3)
            sampled = dec.generate(PROMPT, max_tokens=48, json_schema=PERSON,
                                   sampling={"temperature": 1.0, "seed": 7})
            return greedy, sampled, dec._core.ctx.lazy_logits_masked_rows
        finally:
            _checks.sparse_head(old)

    whole, sparse = run(0), run(16)
    assert whole[2] == 0 and sparse[2] > 0          # the masked rows were taken
    assert sparse[0].tokens == whole[0].tokens and sparse[1].tokens == whole[1].tokens
    assert sparse[0].logprobs == whole[0].logprobs
    jsonschema.validate(json.loads(sparse[0].text), PERSON)


@pytest.mark.parametrize("drafter", ["ngram", "never"])
def test_forced_tokens_are_drafted_in_rounds_held_plain(exact_gemma, monkeypatch, drafter):
    """A round whose policy caps the draft at 0 (the adaptive policy's plain rounds, the
    batch's floor while drafting does not pay) still drafts the grammar's forced tokens:
    they cost no drafting and are accepted. Exact mode: the output is constrained plain
    decoding's, token for token."""
    from specdec import _checks, scheduler
    from specdec.drafters import Drafter

    class Never(Drafter):
        def propose(self, seq, last_token, n_max):
            raise AssertionError("a round held plain asked the drafter")

    plain = Decoder(exact_gemma, exact=True, n_ctx=1024).generate(PROMPT, max_tokens=64,
                                                                    json_schema=PERSON)
    monkeypatch.setattr(scheduler, "new_policy",
                        lambda n_max, adaptive=False: _checks.HeldPolicy(n_max))
    dec = Decoder(exact_gemma, drafter=Never("never") if drafter == "never" else drafter,
                  n_max=6, exact=True, n_ctx=1024)
    res = dec.generate(PROMPT, max_tokens=64, json_schema=PERSON)
    assert res.tokens == plain.tokens
    assert res.stats.drafted >= 6, res.stats
    assert res.stats.accepted >= 0.9 * res.stats.drafted
    assert res.stats.rounds < res.stats.n_generated


def test_exact_constrained_mtp_equals_constrained_plain(bigram_eos_path):
    """The MTP drafter (a synthetic target with its MTP layer) under a regex and a GBNF
    grammar: exact-mode constrained speculation is constrained plain decoding."""
    target = specdec.Model(bigram_eos_path, use_extra_bufts=False, load_mtp=True)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    for constraint in ({"regex": r"[a-zA-Z ]{0,30}"},
                       {"grammar": 'root ::= [a-f]+ [0-9] [a-z]{2,12}'}):
        plain = Decoder(target, exact=True, n_ctx=256).generate(prompt, max_tokens=30,
                                                                 **constraint)
        spec = Decoder(target, drafter="mtp", n_max=3, exact=True, n_ctx=256).generate(
            prompt, max_tokens=30, **constraint)
        assert spec.tokens == plain.tokens, constraint
        assert spec.stats.drafted > 0


def test_a_model_without_an_end_token_refuses_constraints_clearly(bigram_tiny_path):
    """A grammar ends with the model's end-of-generation token: a model that declares none
    gets a ValueError that says so when the request is made, and stays usable."""
    dec = Decoder(bigram_tiny_path, n_ctx=256)
    with pytest.raises(ValueError, match="end-of-generation token"):
        dec.generate([3, 1, 4], max_tokens=4, regex="[a-z]+")
    assert len(dec.generate([3, 1, 4], max_tokens=4).tokens) == 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lockstep_verification_shares_the_head_passes(exact_gemma, temperature):
    """The sequences of a decode under a grammar, greedy and sampled, are verified together:
    the rows that need the whole lazy head share its passes (a rejection ends a sequence's
    rows, and a row rides along only where it needs the whole head too). Four schema
    requests on one KV stream (the lazy head then serves their batch), exact mode: the
    tokens are those of the sequences verified one after the other
    (``_checks.lockstep(False)``; sampled, each request draws from its own seeded
    generator in the same order), in fewer passes over the head and no more whole rows."""
    from specdec import _checks
    from specdec._controller import Controller, new_policy
    from specdec._core import Context
    from specdec.benchmark.structured_prompts import SETS
    from specdec.drafters import create

    reqs = SETS["extract"][:4]
    grammar = Constraint(json_schema=reqs[0].schema).compile(exact_gemma)

    def run(on):
        old = _checks.lockstep(on)
        ctx = Context(exact_gemma, n_ctx=4 * 1024, n_batch=512, n_seq_max=4, kv_unified=True,
                      lazy_logits=True, batch_invariant=True)
        try:
            d = create("ngram")
            d.bind(ctx, 4)
            ctl = Controller(ctx, [d], n_max=6, exact=True, n_ctx_seq=1024)
            for i, r in enumerate(reqs):
                ctl.join(i, exact_gemma.tokenize(r.text, add_special=True, parse_special=True),
                         max_tokens=96, n_max=6, policy=new_policy(6),
                         grammar=grammar.state(), temperature=temperature, seed=7 + i)
            p0 = ctx.lazy_logits_passes
            while ctl.step():
                pass
            p1 = ctx.lazy_logits_passes
            return ([ctl.tokens(i) for i in range(4)],
                    [(ctl.text(i), ctl.finish_reason(i)) for i in range(4)],
                    (p1[0] - p0[0], p1[1] - p0[1]))
        finally:
            _checks.lockstep(old)
            ctx.close()

    one_by_one, together = run(False), run(True)
    assert together[0] == one_by_one[0]
    assert together[2][0] < 0.8 * one_by_one[2][0], (together[2], one_by_one[2])
    assert together[2][1] <= one_by_one[2][1], (together[2], one_by_one[2])
    assert together[1] == one_by_one[1]


@pytest.mark.parametrize("given", [dict(regex="a+", choices=["a"]),
                                   dict(grammar='root ::= "a"', lark='start: "a"'), {}])
def test_constraint_takes_exactly_one_field(given):
    # found by the adversarial sweep: Constraint(regex=..., choices=...) was built, and its
    # kind (the first field set) silently dropped the other
    with pytest.raises(ValueError, match="a Constraint takes one of") as e:
        Constraint(**given)
    assert all(name in str(e.value) for name in given) or "none" in str(e.value)
    assert Constraint(regex="a+").kind == "regex"
