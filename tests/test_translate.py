"""Drafts from a model with another tokenizer (``draft:PATH`` with ``translate``): the same
letter language under several vocabularies (``specdec.testing.vocabs``). Greedy output in
exact mode equals plain output token for token, whatever the draft; a draft that speaks the
same language is accepted almost always, so a broken translation shows in the rates."""
import json
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import specdec
from specdec import Context, Decoder
from specdec._checks import CheckedController
from specdec._sampling import Distribution
from specdec.config import SpecConfig
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.translate import translation
from specdec.testing.vocabs import letter_cycle, write_letter_model
from test_rejection_sampling import _chi2_pvalue   # checks that every sample is possible


@pytest.fixture(scope="module")
def letters(model_file):
    """letters(variant, **kw) -> path of the letter model in that vocabulary."""
    def get(variant, **kw):
        tag = "-".join(f"{k}{v}" for k, v in sorted(kw.items()))
        return model_file(f"letters-{variant}{tag}.gguf",
                          lambda p: write_letter_model(p, variant, **kw))
    return get


@pytest.fixture(scope="module")
def target(letters):
    return specdec.Model(letters("target"), use_extra_bufts=False)


def _prompts():
    cyc = letter_cycle()
    rng = np.random.default_rng(0)
    return (["".join(rng.choice(list(cyc), 12)) for _ in range(3)]
            + [cyc[5:20], "hello world " + cyc[:3], "héllo wörld 😀 " + cyc[7:9], "日本" + cyc[40:45],
               "x\n\n  " + cyc[30]])


def _run(target, drafter, *, adaptive, max_tokens=40, prompts=None):
    """Output of every prompt equals exact plain output; (generated, drafted, accepted)."""
    plain = Decoder(target, exact=True, n_ctx=512)
    spec = Decoder(target, drafter=drafter, n_max=4, adaptive=adaptive, exact=True, n_ctx=512)
    gen = drafted = accepted = 0
    for p in (prompts or []) + _prompts():
        got = spec.generate(p, max_tokens=max_tokens)
        want = plain.generate(p, max_tokens=max_tokens)
        assert got.tokens == want.tokens, p
        gen += len(got.tokens)
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    return gen, drafted, accepted


@pytest.mark.parametrize("variant, mode", [("permuted", "ids"), ("padded", "ids"),
                                           ("shifted", "text"), ("chars", "text")])
def test_way_picked_at_load(target, letters, variant, mode):
    t = translation(target, specdec.Model(letters(variant)))
    assert t.mode == mode


@pytest.mark.parametrize("variant, mode", [("permuted", True), ("padded", True),
                                           ("shifted", True), ("chars", True),
                                           ("permuted", "text"), ("padded", "text")])
def test_greedy_equals_plain_adaptive(target, letters, variant, mode):
    d = DraftModelDrafter(letters(variant), translate=mode)
    gen, drafted, accepted = _run(target, d, adaptive=True)
    assert d.translation is not None
    assert drafted > 0 and accepted >= 0.9 * drafted, (drafted, accepted)


@pytest.mark.parametrize("variant, mode", [("permuted", True), ("padded", True),
                                           ("shifted", True), ("chars", True),
                                           ("permuted", "text")])
def test_acceptance_fixed_length(target, letters, variant, mode):
    """Fixed n_max: most of the output is drafted, and nearly every draft is right."""
    d = DraftModelDrafter(letters(variant), translate=mode)
    gen, drafted, accepted = _run(target, d, adaptive=False)
    print(f"{variant}/{d.translation.mode}: drafted {drafted} of {gen}, accepted {accepted}")
    assert drafted >= 0.5 * gen and accepted >= 0.9 * drafted, (gen, drafted, accepted)


@pytest.mark.parametrize("target_variant, draft_variant", [
    ("target", "chars"), ("chars", "target"), ("shifted", "chars"), ("chars", "padded")])
def test_two_byte_letters(letters, target_variant, draft_variant):
    """With two-byte letters: a bytes-only draft ends drafts inside a character (the partial
    UTF-8 tail is held back), a bytes-only target's text ends inside one (no draft until it
    is whole); acceptance stays high and output exact, adaptive or not."""
    target = specdec.Model(letters(target_variant, accents=True), use_extra_bufts=False)
    prompts = [letter_cycle(accents=True)[i:i + 5] for i in range(0, 60, 12)]
    for adaptive in (False, True):
        d = DraftModelDrafter(letters(draft_variant, accents=True), translate=True)
        gen, drafted, accepted = _run(target, d, adaptive=adaptive, prompts=prompts)
        print(f"{target_variant}<-{draft_variant} adaptive={adaptive}: drafted {drafted} of "
              f"{gen}, accepted {accepted}")
        assert accepted >= 0.9 * drafted and drafted >= (0.5 * gen if not adaptive else 1)


def test_wrong_language_stays_exact(target, letters):
    """A draft in another letter order (through text) is mostly wrong: output is the target's."""
    d = DraftModelDrafter(letters("chars", seed=5), translate=True)
    gen, drafted, accepted = _run(target, d, adaptive=False)
    assert drafted > 0 and accepted < 0.5 * drafted


def test_refused_without_translate(target, letters):
    with pytest.raises(ValueError, match="translate"):
        Decoder(target, drafter=f"draft:{letters('chars')}", n_ctx=256)
    with pytest.raises(ValueError, match="translate"):
        DraftModelDrafter(letters("chars"), translate="sometimes")


def test_untranslatable_draft_is_refused(target, tiny_dense_path):
    """The tiny dense model's test tokenizer spells no text the letter model can read."""
    with pytest.raises(ValueError, match="do not spell the same text"):
        Decoder(target, drafter=DraftModelDrafter(tiny_dense_path, translate=True), n_ctx=256)
    assert Decoder(target, n_ctx=256).generate("ab", max_tokens=3).tokens


def test_cli_draft_translate(letters):
    args = ["generate", "-m", letters("target"), "-p", letter_cycle()[:6], "-n", "16", "--json",
            "-d", f"draft:{letters('chars')}", "--draft-translate"]
    run = lambda a: subprocess.run([sys.executable, "-m", "specdec", *a], capture_output=True,
                                   text=True, timeout=300, cwd=tempfile.gettempdir())
    p = run(args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["stats"]["accepted"] > 0
    p = run(args[:-1])
    assert p.returncode != 0 and "translate" in p.stderr


# --- sampled verification keeps the target's distribution ---------------------------------

TOP_K, TEMP, N_SEQ, N_SAMPLES = 4, 1.0, 16, 1600


def _dist(ctx, prefix):
    ctx.clear()
    b = specdec.Batch(64)
    for i, t in enumerate(prefix):
        b.add(t, i, 0, i == len(prefix) - 1)
    ctx.decode(b)
    return Distribution().set_logits(np.array(ctx.logits()), temperature=TEMP,
                                     top_k=TOP_K).as_dict()


@pytest.mark.parametrize("variant", ["chars", "permuted"])
def test_sampled_distribution_matches_target(letters, variant):
    """A soft target (successor logit 3 plus noise) sampled with translated drafts (through
    text, through the id map): the first three tokens follow the target's own distribution
    (chi-square)."""
    model = specdec.Model(letters("target", logit=3.0, noise=1.0))
    prompt = model.tokenize(letter_cycle()[:7], add_special=False)
    ctx = Context(model, n_ctx=64, n_batch=64)
    joint = {}
    for a, pa in _dist(ctx, prompt).items():
        for b, pb in _dist(ctx, prompt + [a]).items():
            for c, pc in _dist(ctx, prompt + [a, b]).items():
                joint[(a, b, c)] = pa * pb * pc
    tgt = Context(model, n_ctx=64 * N_SEQ, n_batch=64, n_seq_max=N_SEQ)
    d = DraftModelDrafter(letters(variant), translate=True)
    d.configure(SpecConfig(n_max=2))
    d.bind(tgt, N_SEQ)
    ctl = CheckedController(tgt, [d], n_max=2, temperature=TEMP, top_k=TOP_K)
    counts = {}
    drafted = accepted = 0
    for r in range(N_SAMPLES // N_SEQ):
        ctl.start([prompt] * N_SEQ, 3, seeds=[1000 * r + i for i in range(N_SEQ)])
        ctl.run()
        for i in range(N_SEQ):
            k = tuple(ctl.tokens(i))
            counts[k] = counts.get(k, 0) + 1
        st = ctl.stats()
        drafted += st["drafted"]
        accepted += st["accepted"]
    assert drafted > 0 and 0 < accepted < drafted
    p = _chi2_pvalue(counts, joint)
    print(f"translated drafts ({d.translation.mode}): accepted {accepted}/{drafted}, chi-square p={p:.3f}")
    assert p > 1e-3, f"chi-square p={p:.2e}: translated drafts do not follow the target"
