"""specdec's drafts against llama.cpp's own (``llama-speculative-simple -v``), shared by the
reference tests of the model drafters.

The tool logs every draft token (its top candidate per draft step) and every verification
(``accepted A/K``). specdec's controller records the same with ``record=True``. Both run
greedy on the same model and prompt, so every draft made from the same position (the same
committed history) must be the same tokens, with the same accepted count.
"""
from __future__ import annotations

from typing import Optional, Sequence

from specdec import Decoder, Model
from specdec._checks import CheckedController


def echo(path: str, prompt: str) -> str:
    """The prompt as llama.cpp prints it back (the test vocab detokenizes to hex)."""
    m = Model(path)
    return b"".join(m.token_to_piece(t, special=True) for t in
                    m.tokenize(prompt, add_special=True, parse_special=True)).decode("utf-8", "replace")


def specdec_drafts(path: str, prompt: str, n_max: int, n_gen: int, drafter: str = "mtp"):
    """``{pos: (drafts, accepted)}`` of specdec's rounds, and the prompt length."""
    dec = Decoder(path, drafter=drafter, n_max=n_max, n_ctx=1024, n_threads=2)
    ctl = CheckedController(dec.ctx, dec.drafters, n_max=n_max, record=True)
    toks = dec.tokenize(prompt)
    ctl.start([toks], n_gen)
    ctl.run()
    return {pos: (d, a) for _, pos, d, a in ctl.draft_log}, len(toks)


def llama_drafts(rounds, n_prompt: int):
    """Positions of llama.cpp's rounds: its first pending token is the last prompt token
    (it decodes the prompt but one, so its first draft is the first generated token, where
    specdec drafts from the first generated token), and each round moves by accepted + 1."""
    out, pos = {}, n_prompt - 1
    for d, a in rounds:
        if d:
            out[pos] = (d, a)
        pos += a + 1
    return out


def compare(path: str, prompt: str, n_max: int, llama_tools, n_gen: int, *,
            spec_type: str = "draft-mtp", drafter: str = "mtp", draft: Optional[str] = None,
            extra: Sequence[str] = ()):
    """Assert that the rounds both sides start at the same positions drafted the same tokens
    with the same verdict; returns them."""
    ref = llama_tools.run_spec_simple(path, prompt, n_gen, spec_type=spec_type, n_max=n_max,
                                      drafts=True, echo=echo(path, prompt), draft=draft,
                                      extra=("-c", "1024", *extra))
    ours, n_prompt = specdec_drafts(path, prompt, n_max, n_gen, drafter)
    theirs = llama_drafts(ref["drafts"], n_prompt)
    # the rounds of both start at the same positions once they meet (same state, same
    # draft, same verdict); llama.cpp trims its last drafts to the remaining budget
    last = n_prompt + n_gen - 2 * n_max - 2
    common = sorted(p for p in ours.keys() & theirs.keys() if p < last)
    assert len(common) >= 0.6 * len([p for p in ours if p < last]) and len(common) >= 10, \
        f"too few rounds at the same positions ({len(common)} of {len(ours)})"
    for p in common:
        assert ours[p] == theirs[p], (f"position {p}: specdec drafted {ours[p][0]} (accepted "
                                      f"{ours[p][1]}), llama.cpp {theirs[p][0]} (accepted "
                                      f"{theirs[p][1]})")
    return [ours[p] for p in common]
