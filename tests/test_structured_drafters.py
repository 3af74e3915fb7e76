"""Exact mode under a grammar, every built-in drafter on a synthetic target: constrained
speculation gives constrained plain decoding's tokens, token for token (issue 31).

The targets are synthetic, with an end-of-generation token (a grammar ends with it): the
bigram model (``specdec.testing.bigram``, a hybrid whose greedy text is a cycle of successors)
for the drafters that read text (n-gram lookups, suffix trees), its MTP layer
(``test_structured.py``) and a synthetic EAGLE-3 head, its periodic variant for a synthetic
DFlash draft, and a two-layer byte-token llama (``specdec.testing.chat``; a draft model or a
layer skip needs attention-only layers) for itself as a draft model and its first layer.
Under the grammar the masked argmax leaves the model's own text wherever the grammar refuses
it, so drafts are cut and rejected as well as accepted. gemma3-270m's share of the matrix is
``test_structured.py`` (it has no MTP layer, EAGLE-3 head or DFlash draft).
"""
from __future__ import annotations

import pytest

import specdec
from specdec import Decoder
from specdec.testing import write_bigram_mtp_model

pytest.importorskip("llguidance")

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
#: the choices force text after their first byte: the bigram model's pieces are its ids in
#: hex while its tokenizer maps bytes to ids, so the forced text is tokenized from the pieces
#: (``constraint._Vocab``)
CONSTRAINTS = [{"regex": r"[a-zA-Z ]{0,80}"},
               {"grammar": 'root ::= [a-f]+ [0-9] [a-z]{2,12}'},
               {"choices": ["beef", "bead", "cafe0"]}]
EOS = 7
PERIOD = 16


@pytest.fixture(scope="module")
def periodic_path(model_file) -> str:
    """The bigram target whose greedy text repeats every PERIOD tokens (DFlash's)."""
    return model_file(f"bigram-qwen35-period{PERIOD}-eos{EOS}.gguf",
                      lambda p: write_bigram_mtp_model(p, period=PERIOD, eos_token_id=EOS))


def _drafter(name: str, target: str, model_file):
    """The drafter's spec, or a maker of a fresh one (the n-gram maps with 4-token values:
    the default 48 would need longer answers than these)."""
    if name.startswith("ngram-map"):
        from specdec.drafters.ngram_map import NgramMapDrafter, NgramMapK4VDrafter
        cls = NgramMapK4VDrafter if name == "ngram-map-k4v" else NgramMapDrafter
        return lambda: cls(2, 4)
    if name == "eagle3":
        from specdec.testing.eagle3 import write_eagle3_draft
        return "eagle3:" + model_file("eagle3-for-bigram-eos.gguf",
                                      lambda p: write_eagle3_draft(p, target))
    if name == "dflash":
        from specdec.testing.dflash import write_dflash_draft
        return "dflash:" + model_file(f"dflash-for-period{PERIOD}-eos.gguf",
                                      lambda p: write_dflash_draft(p, target, acceptance=0.7))
    return name.replace("SELF", target)


def _check(target_path: str, drafter, prompt=PROMPT, constraints=CONSTRAINTS,
           n_max: int = 4, drafts: bool = True) -> None:
    """Exact mode: constrained speculation with ``drafter`` gives constrained plain
    decoding's tokens under each constraint; ``drafts``: the first constraint (a regex that
    forces no token) saw the drafter's own drafts."""
    target = specdec.Model(target_path, use_extra_bufts=False)
    for i, constraint in enumerate(constraints):
        plain = Decoder(target, exact=True, n_ctx=256).generate(prompt, max_tokens=64,
                                                                 **constraint)
        spec = Decoder(target, drafter=drafter() if callable(drafter) else drafter,
                       n_max=n_max, exact=True, n_ctx=256).generate(prompt, max_tokens=64,
                                                                    **constraint)
        assert spec.tokens == plain.tokens, (drafter, constraint)
        assert spec.finish_reason == plain.finish_reason, (drafter, constraint)
        if i == 0 and drafts:
            assert spec.stats.drafted > 0, drafter


@pytest.mark.parametrize("drafter", ["ngram", "ngram-map", "ngram-map-k4v", "ngram-cache",
                                     "suffix", "eagle3"])
def test_exact_constrained_speculation_every_drafter(bigram_eos_path, model_file, drafter):
    _check(bigram_eos_path, _drafter(drafter, bigram_eos_path, model_file))


def test_exact_constrained_dflash(periodic_path, model_file):
    _check(periodic_path, _drafter("dflash", periodic_path, model_file), n_max=PERIOD - 1)


@pytest.mark.parametrize("drafter", ["draft:SELF", "layerskip:1"])
def test_exact_constrained_draft_models(model_file, drafter):
    """The byte model's own greedy text is "ab" and its end: under these grammars the draft
    model proposes it and the grammar cuts or the target rejects it, or it is forced."""
    from specdec.testing.chat import write_tiny_chat
    path = model_file("tiny-bytes-2-layers.gguf", lambda p: write_tiny_chat(
        p, "chatml", chat_template=None, reply="ab", n_layer=2))
    _check(path, drafter.replace("SELF", path), prompt="xyz", drafts=False,
           constraints=[{"regex": r"a[a-z]{2,6}[0-9]+"}, {"choices": ["abc", "abd", "ba"]},
                        {"json_schema": {"type": "object",
                                         "properties": {"n": {"type": "integer"}},
                                         "required": ["n"]}}])
