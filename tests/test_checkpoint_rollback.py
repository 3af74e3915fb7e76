"""Checkpoint rollback: recurrent and hybrid targets without n_rollback snapshots (mamba2, rwkv7;
qwen3next, whose attention KV is trimmed while its recurrent part is restored, with n-gram,
draft-model and its own MTP drafts) save their state before a verify, restore it on a
partial accept and decode the kept tokens again. Greedy output in exact mode must equal plain output token for token, and a
restored-then-continued state must equal a replay bit for bit."""
import numpy as np
import pytest

import specdec
from specdec import Batch, Context, Decoder
from specdec._checks import DrivenController
from specdec.drafters import Drafter


@pytest.fixture(scope="module")
def mamba2(tiny_mamba2_path):
    return specdec.Model(tiny_mamba2_path, use_extra_bufts=False)


@pytest.fixture(scope="module")
def qwen3next(tiny_qwen3next_path):
    return specdec.Model(tiny_qwen3next_path, use_extra_bufts=False)


@pytest.fixture(scope="module")
def rwkv7(model_file):
    from specdec.testing import write_tiny_rwkv7
    return specdec.Model(model_file("tiny-rwkv7.gguf", lambda p: write_tiny_rwkv7(p, seed=1)),
                         use_extra_bufts=False)


@pytest.fixture(scope="module", params=["mamba2", "qwen3next", "rwkv7"])
def target(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def draft_path(model_file):
    from specdec.testing import write_tiny_dense
    return model_file("tiny-dense-draft-7.gguf", lambda p: write_tiny_dense(p, seed=7))


def _prompts(plain):
    """Prompts whose history holds the model's own continuation (n-gram drafts that are
    partly right) next to ones that hold none."""
    out = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        p = [int(t) for t in rng.integers(0, 256, 24)]
        cont = plain.generate(p, max_tokens=40).tokens
        out.append(p + cont[:30] + p)
        out.append(p)
    return out


def _equals_exact_plain(target, spec, *, n_prompts, max_tokens):
    """Every prompt's output of ``spec`` equals exact plain output; returns the summed
    (drafted, accepted, redecodes)."""
    plain = Decoder(target, exact=True, n_ctx=512)
    drafted = accepted = redecodes = 0
    for p in _prompts(plain)[:n_prompts]:
        res = spec.generate(p, max_tokens=max_tokens)
        assert res.tokens == plain.generate(p, max_tokens=max_tokens).tokens
        drafted += res.stats.drafted
        accepted += res.stats.accepted
        redecodes += res.stats.redecodes
    return drafted, accepted, redecodes


def test_targets_roll_back_by_checkpoint(target):
    assert (target.is_recurrent or target.is_hybrid) and not target.supports_partial_rollback
    with pytest.raises(ValueError, match="checkpoints"):
        Context(target, n_ctx=256, n_rollback=4)
    ctx = Context(target, n_ctx=256)
    d = Wrong()
    d.bind(ctx, 1)
    assert DrivenController(ctx, [d], n_max=16).n_sequences == 0   # drafts of any depth


@pytest.mark.parametrize("n_max", [3, 8])
def test_exact_ngram_equals_plain(target, n_max):
    spec = Decoder(target, drafter="ngram", n_max=n_max, adaptive=True, exact=True, n_ctx=512)
    drafted, accepted, redecodes = _equals_exact_plain(target, spec, n_prompts=None, max_tokens=64)
    assert redecodes > 0 and accepted > 0


@pytest.mark.parametrize("name", ["mamba2", "rwkv7"])
def test_exact_draft_model_equals_plain(request, name, draft_path):
    model = request.getfixturevalue(name)
    spec = Decoder(model, drafter=f"draft:{draft_path}", n_max=4, adaptive=True, exact=True,
                   n_ctx=512)
    drafted, accepted, redecodes = _equals_exact_plain(model, spec, n_prompts=4, max_tokens=48)
    assert drafted > 0 and redecodes > 0


@pytest.fixture(scope="module")
def qwen3next_bigram(model_file):
    """qwen3next_bigram(noise) -> path: a qwen3next bigram target whose MTP head drafts its
    next token (noise on the head's eh_proj lowers acceptance)."""
    from specdec.testing import write_bigram_mtp_model
    return lambda noise: model_file(
        f"bigram-qwen3next-n{noise}.gguf",
        lambda p: write_bigram_mtp_model(p, arch="qwen3next", noise=noise))


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_exact_mtp_equals_plain_qwen3next(qwen3next_bigram, noise):
    """The target's own MTP head on qwen3next (its MTP graph prunes to the output rows, so
    the head's context reads hidden rows masked), rolled back by checkpoints."""
    from specdec.testing import mtp_draft_accuracy
    path = qwen3next_bigram(noise)
    model = specdec.Model(path, load_mtp=True, use_extra_bufts=False)
    spec = Decoder(model, drafter="mtp", n_max=4, adaptive=True, exact=True, n_ctx=512)
    drafted, accepted, redecodes = _equals_exact_plain(model, spec, n_prompts=None,
                                                      max_tokens=48)
    print(f"qwen3next MTP noise {noise}: accepted {accepted}/{drafted} "
          f"(head accuracy {mtp_draft_accuracy(path):.2f}), {redecodes} re-decodes")
    assert drafted > 0 and accepted > 0.5 * drafted
    if noise:
        assert accepted < drafted and redecodes > 0


def test_exact_mtp_random_qwen3next(model_file):
    """A random MTP head is nearly always wrong: every round restores and decodes again."""
    from specdec.testing import write_tiny_qwen3next
    path = model_file("tiny-qwen3next-mtp-3.gguf", lambda p: write_tiny_qwen3next(p, seed=3))
    model = specdec.Model(path, load_mtp=True, use_extra_bufts=False)
    spec = Decoder(model, drafter="mtp", n_max=3, adaptive=True, exact=True, n_ctx=512)
    drafted, accepted, redecodes = _equals_exact_plain(model, spec, n_prompts=3, max_tokens=40)
    assert drafted > 0 and redecodes > 0


def test_pruned_mtp_graph_refuses_dense_rows(qwen3next_bigram):
    """qwen3next's MTP graph keeps hidden rows of output tokens only: reading one per batch
    entry would run past the tensor, so it is refused before llama.cpp could abort."""
    model = specdec.Model(qwen3next_bigram(0.0), load_mtp=True)
    with pytest.raises(ValueError, match="masked"):
        Context(model, kind="mtp", n_ctx=64, mtp_hidden="dense")
    ctx = Context(model, kind="mtp", n_ctx=64)
    assert ctx.mtp_hidden == "masked"
    with pytest.raises(ValueError, match="masked"):
        ctx.set_mtp_hidden("dense")
    assert ctx.mtp_hidden == "masked"


class Wrong(Drafter):
    """Always drafts tokens the target never picks next (the token it just emitted, +1)."""

    def __init__(self):
        super().__init__("wrong")

    def propose(self, seq, last_token, n_max):
        return [(last_token + 1 + i) % 256 for i in range(n_max)]


def test_never_right_drafter_changes_nothing(target):
    """Fixed n_max, every draft rejected: every round restores and decodes again."""
    ctx = Context(target, n_ctx=512, n_batch=64, batch_invariant=True)
    plain = DrivenController(ctx, [], exact=True)
    prompt = [5, 17, 200, 31, 9]
    plain.start([prompt], 50)
    plain.run()
    want = plain.tokens()
    d = Wrong()
    d.bind(ctx, 1)
    ctl = DrivenController(ctx, [d], n_max=4, exact=True)
    ctl.start([prompt], 50)
    ctl.run()
    assert ctl.tokens() == want
    st = ctl.stats()
    assert st["redecodes"] > 0 and st["accepted"] < st["drafted"]


def _decode(ctx, toks, pos0):
    b = Batch(64)
    for i, t in enumerate(toks):
        b.add(t, pos0 + i, 0, True)
    ctx.decode(b)
    return np.array(ctx.logits(len(toks) - 1))


@pytest.mark.parametrize("partial", [True, False])
def test_restore_then_continue_equals_replay(target, partial):
    """Save, decode drafts, restore (the recurrent part; a hybrid's attention KV trimmed
    with seq_rm), decode the kept prefix and go on: the logits are those of a context that
    only ever saw the kept tokens (batch-invariant, so bit for bit)."""
    prompt = [3, 141, 59, 26, 53, 58, 97]
    kept, drafts, more = [9, 32], [38, 46, 26, 43], [38, 32, 79]
    a = Context(target, n_ctx=128, n_batch=64, batch_invariant=True)
    _decode(a, prompt, 0)
    ckpt = a.save_state(0, partial=partial)
    n = len(prompt)
    _decode(a, kept + drafts, n)
    a.load_state(ckpt, 0, partial=partial)
    assert a.seq_rm(0, n, -1)
    assert a.seq_pos_max(0) == n - 1
    got = [_decode(a, kept, n), _decode(a, more, n + len(kept))]

    b = Context(target, n_ctx=128, n_batch=64, batch_invariant=True)
    _decode(b, prompt, 0)
    want = [_decode(b, kept, n), _decode(b, more, n + len(kept))]
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_sequences_roll_back_independently(target):
    """Several sequences in one verify batch, each restored from its own checkpoint."""
    prompts = [[5, 17, 200, 31, 9], [7, 7, 1, 250], [100, 3, 44, 90, 12, 8]]
    ctx = Context(target, n_ctx=512, n_batch=64, n_seq_max=3)
    plain = DrivenController(ctx, [])
    plain.start(prompts, 30)
    plain.run()
    want = [plain.tokens(i) for i in range(3)]
    d = Wrong()
    d.bind(ctx, 3)
    ctl = DrivenController(ctx, [d], n_max=3)
    ctl.start(prompts, 30)
    ctl.run()
    assert [ctl.tokens(i) for i in range(3)] == want
    assert ctl.stats()["redecodes"] > 0
