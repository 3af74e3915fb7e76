"""Every layer on a local GPU: speculative decoding gives the CPU's tokens, exact mode holds
where the device's kernels were shown batch-invariant and is refused, by name, where not, and
everything that reads model memory (MTP hidden rows, recurrent rollback, checkpoints, the lazy
LM head) works or steps aside.

Opt-in, one variable per backend, on a build that has it (``-Dvulkan=true``, ``-Dcuda=true``):
``SPECDEC_TEST_VULKAN=1`` (Mesa's lavapipe is a CPU-type Vulkan device, which ggml-vulkan uses
only when named: ``GGML_VK_VISIBLE_DEVICES=0``) and ``SPECDEC_TEST_CUDA=1``. Without the
variable, the backend or a device, the tests skip. The models are tiny and synthetic: the
trunk-bigram qwen35 (gated delta net + attention, with an MTP block) has a wide margin between
its greedy token and the next, so a device's rounding cannot change its greedy output.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import specdec
from specdec import Batch, Context, Decoder, Model
from specdec.testing import bigram_successor, write_bigram_mtp_model

from offhost import recurrent_rollback, rollback_and_checkpoint

#: backend -> the variable that opts its tests in
OPT_IN = {"Vulkan": "SPECDEC_TEST_VULKAN", "CUDA": "SPECDEC_TEST_CUDA"}

#: drafters run on the bigram qwen35 (hybrid: recurrent state rolled back by snapshots)
HYBRID_DRAFTERS = ["ngram", "ngram-map", "ngram-map-k4v", "ngram-cache", "suffix", "mtp"]
#: drafters with a model of their own, which must be attention-only: run on the tiny llama
MODEL_DRAFTERS = ["draft", "layerskip:1"]


@pytest.fixture(scope="module", params=sorted(OPT_IN))
def backend(request) -> str:
    """A GPU backend whose tests were asked for, compiled in, with a device found."""
    name, var = request.param, OPT_IN[request.param]
    if os.environ.get(var) != "1":
        pytest.skip(f"opt-in: {var}=1")
    if name not in specdec.backends():
        pytest.skip(f"this build has no {name} backend (build with -D{name.lower()}=true)")
    if not any(d["backend"] == name for d in specdec.devices()):
        hint = " (lavapipe: GGML_VK_VISIBLE_DEVICES=0)" if name == "Vulkan" else ""
        pytest.skip(f"no {name} device found{hint}")
    return name


def on_device(ctx: Context, backend: str) -> bool:
    """Whether the context's layers are on the device (a context of a model with no layers
    there still has the device's backend: llama.cpp offloads big prompt batches to it)."""
    return (ctx.model.placement.n_gpu_layers != 0
            and any(b.startswith(backend) for b in ctx.backends))


@pytest.fixture(scope="module", params=["f32", "q8_0"])
def bigram(request, model_file) -> str:
    """The trunk-bigram model, with float and with quantized weights (other matmul kernels)."""
    dtype = request.param
    return model_file(f"gpu-bigram-{dtype}.gguf",
                      lambda p: write_bigram_mtp_model(p, noise=0.2, dtype=dtype))


def chain_prompt(path: str) -> tuple:
    """A prompt that repeats the start of its own bigram chain, so that the n-gram drafters
    find what follows (ngram-map: a 12-token key with 48 tokens after it); and the greedy
    continuation the model must give."""
    succ = bigram_successor(path)
    chain = [3]
    for _ in range(63):
        chain.append(int(succ[chain[-1]]))
    prompt = chain + chain[:13]
    return prompt, chain[13:13 + 32]


@pytest.mark.parametrize("drafter", HYBRID_DRAFTERS)
def test_drafters_on_the_device_give_the_cpus_tokens(backend, bigram, drafter):
    prompt, want = chain_prompt(bigram)
    cpu = Decoder(bigram, exact=True).generate(prompt, max_tokens=32)
    assert cpu.tokens == want
    dec = Decoder(bigram, drafter=drafter, n_max=3, n_gpu_layers=-1)
    assert on_device(dec.ctx, backend)
    res = dec.generate(prompt, max_tokens=32)
    assert res.tokens == want
    assert res.stats.accepted > 0
    if drafter == "mtp":
        # the head reads the target's hidden rows off the device; with noise it is wrong at
        # times, and the recurrent state is rolled back by snapshots, on the device
        assert dec.ctx.rollback_trim and dec.ctx.n_rollback == 3
        assert res.stats.drafted > res.stats.accepted
        assert dec.drafters[0].mtp_model is dec.model


DENSE_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


@pytest.mark.parametrize("drafter", MODEL_DRAFTERS)
def test_draft_models_on_the_device_give_the_cpus_tokens(backend, tiny_dense_path, drafter):
    want = Decoder(tiny_dense_path, exact=True).generate(DENSE_PROMPT, max_tokens=32).tokens
    spec = f"draft:{tiny_dense_path}" if drafter == "draft" else drafter
    dec = Decoder(tiny_dense_path, drafter=spec, n_max=3, n_gpu_layers=-1)
    res = dec.generate(DENSE_PROMPT, max_tokens=32)
    assert res.tokens == want and res.stats.drafted > 0
    assert on_device(dec.ctx, backend)
    assert on_device(dec.drafters[0].draft_ctx, backend)      # the drafter's model follows the target
    if drafter == "draft":
        assert res.stats.accepted > 0                   # the target itself, as its own draft
    dec = Decoder(tiny_dense_path, drafter=spec, n_max=3, n_gpu_layers=-1, n_gpu_layers_draft=0)
    assert not on_device(dec.drafters[0].draft_ctx, backend)
    assert dec.generate(DENSE_PROMPT, max_tokens=32).tokens == want


def test_mtp_head_on_the_cpu_trunk_on_the_device(backend, bigram):
    prompt, want = chain_prompt(bigram)
    dec = Decoder(bigram, drafter="mtp", n_max=3, n_gpu_layers=-1, n_gpu_layers_draft=0)
    assert not on_device(dec.drafters[0].mtp_ctx, backend) and on_device(dec.ctx, backend)
    assert dec.generate(prompt, max_tokens=32).tokens == want


def _largest_invariant_batch(ctx: Context, rows: int) -> int:
    """The largest row count r <= rows such that batches of 2..r rows give the same rows."""
    while rows > 2:
        bad = ctx.check_batch_invariance(rows)
        if not bad:
            break
        rows = bad
    return rows


def test_exact_mode_holds_as_far_as_the_device_was_checked(backend, bigram):
    """Exact mode is allowed for the verify batches whose rows the device computes alike, and
    there gives the output of exact plain decoding on the device (= the CPU's, for this
    model); longer drafts are refused with the length that holds."""
    prompt, want = chain_prompt(bigram)
    m = Model(bigram, n_gpu_layers=-1, use_extra_bufts=False)
    with Context(m, n_ctx=256, n_batch=64, batch_invariant=True) as ctx:
        assert on_device(ctx, backend) and ctx.invariant_rows == 0   # not known until checked
        holds = _largest_invariant_batch(ctx, 17)
    plain = Decoder(m, exact=True)
    assert plain.ctx.invariant_rows == 2
    assert plain.generate(prompt, max_tokens=32).tokens == want
    if holds >= 3:
        dec = Decoder(m, drafter="ngram", n_max=holds - 1, exact=True)
        assert dec.ctx.invariant_rows == holds
        res = dec.generate(prompt, max_tokens=32)
        assert res.tokens == want and res.stats.accepted > 0
    if holds < 17:
        with pytest.raises(ValueError, match=rf"not batch-invariant.*holds up to "
                                             rf"n_max={holds - 1} \(verify batches of up to "
                                             rf"{holds} rows\)|for no draft length"):
            Decoder(m, drafter="ngram", n_max=16, exact=True)


def _close(dev: list, cpu: list) -> None:
    """A device's logits against the CPU's: the same greedy token, values to rounding."""
    assert len(dev) == len(cpu)
    for x, y in zip(dev, cpu):
        assert int(np.argmax(x)) == int(np.argmax(y))
        np.testing.assert_allclose(x, y, rtol=1e-2, atol=1e-2)


def test_exact_mode_with_the_layers_on_the_cpu_of_a_gpu_build(backend, bigram):
    """A model with no layers on the device still has its backend (llama.cpp offloads ops of
    32 rows or more to it), except in exact mode: long drafts stay exact there."""
    prompt, want = chain_prompt(bigram)
    m = Model(bigram, use_extra_bufts=False)
    assert any(b.startswith(backend) for b in Decoder(m).ctx.backends)
    dec = Decoder(m, drafter="ngram", n_max=40, exact=True)
    assert dec.ctx.invariant_rows == 41
    res = dec.generate(prompt, max_tokens=32)
    assert res.tokens == want and res.stats.accepted > 0


def test_rollback_and_checkpoints_in_device_memory(backend, tiny_dense_path):
    toks = DENSE_PROMPT + DENSE_PROMPT[:4]
    _close(rollback_and_checkpoint(Model(tiny_dense_path, n_gpu_layers=-1), toks),
           rollback_and_checkpoint(Model(tiny_dense_path), toks))


def _recurrent_decodes(m, batches) -> list:
    """Every logits row of these decodes (``(pos0, tokens)`` each, or ``"rm"``: drop the
    positions from 5 on), in a context made as :func:`recurrent_rollback` makes its own."""
    ctx = Context(m, n_ctx=128, n_batch=16, n_rollback=3)
    b = Batch(16)
    seen = []
    for step in batches:
        if step == "rm":
            assert ctx.seq_rm(0, 5)
            continue
        pos0, toks = step
        b.clear()
        for i, t in enumerate(toks):
            b.add(t, pos0 + i, 0, True)
        ctx.decode(b)
        seen += [ctx.logits(i).copy() for i in range(len(toks))]
    return seen


def test_recurrent_rollback_in_device_memory(backend, tiny_qwen35_path):
    """Rollback on the device is exact: the rows after ``seq_rm`` equal, bit for bit, those of
    the same decodes with the rolled-back state never saved and restored, and match a straight
    decode of the kept tokens (the state after token 9 came from a 3-row batch there, and the
    device's gated delta net computes a batch of rows in chunks: equal to rounding). Against
    the CPU only the greedy tokens are compared: the device's kernels round differently (up to
    0.16 on this model's first row, before any rollback)."""
    m = Model(tiny_qwen35_path, n_gpu_layers=-1)
    rolled = recurrent_rollback(m)      # 4 prompt rows, 9/10/11, 12 after rm, 13 after restore
    # the same decodes with no save/restore: the restored state gives the same row 13
    kept = _recurrent_decodes(m, [(0, [5, 6, 7, 8]), (4, [9, 10, 11]), "rm", (5, [12]), (6, [13])])
    assert len(rolled) == len(kept) == 9
    for got, want in zip(rolled, kept):
        np.testing.assert_array_equal(got, want)
    # a straight decode of the kept tokens: the prompt rows bit for bit, the rest to rounding
    straight = _recurrent_decodes(m, [(0, [5, 6, 7, 8]), (4, [9]), (5, [12]), (6, [13])])
    for got, want in zip(rolled[:4], straight[:4]):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(rolled[4:5] + rolled[-2:], straight[4:]):
        assert int(np.argmax(got)) == int(np.argmax(want))
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    cpu = recurrent_rollback(Model(tiny_qwen35_path))
    assert [int(np.argmax(x)) for x in rolled] == [int(np.argmax(y)) for y in cpu]


def test_lazy_head_steps_aside_on_the_device(backend, bigram):
    # the output layer goes to the device first: its norm and LM head are not host memory
    m = Model(bigram, n_gpu_layers=-1)
    prompt, want = chain_prompt(bigram)
    dec = Decoder(m, drafter="ngram", lazy_logits=True)
    assert dec.generate(prompt, max_tokens=24).tokens == want[:24]
    assert dec.ctx.lazy_logits.startswith("unavailable")
    assert Decoder(m, drafter="ngram").ctx.lazy_logits == "off"   # not tried on a device


def _counted_at_once(model: Model) -> None:
    """llama.cpp counts a batch when it synchronizes with the backends: a decode that waited
    for its outputs has been counted before anything is read."""
    with Context(model, n_ctx=128) as ctx:
        b = Batch(8)
        for i, t in enumerate([3, 1, 4, 1, 5]):
            b.add(t, i, 0, i == 4)
        ctx.decode(b)
        b.clear()
        b.add(9, 5, 0, True)
        ctx.decode(b)
        perf = ctx.perf()
        assert (perf["n_p_eval"], perf["n_eval"]) == (5, 1)


def test_decode_waits_for_its_outputs(bigram):
    """The adaptive policy times a verify by the decode call: it must include the compute
    (on a GPU llama_decode returns once the graph is queued)."""
    _counted_at_once(Model(bigram))


def test_decode_waits_for_the_device(backend, bigram):
    _counted_at_once(Model(bigram, n_gpu_layers=-1))
    res = Decoder(bigram, drafter="ngram", n_gpu_layers=-1).generate(
        chain_prompt(bigram)[0], max_tokens=16)
    # the verify time is the target's decode, not the reading of its outputs
    assert res.stats.t_target_s > res.stats.t_verify_s


def test_a_build_without_its_device_runs_on_the_cpu(gemma_path):
    """A GPU build on a machine without that GPU: the CPU works, and asking for the device is
    a clear error naming what is missing."""
    missing = [b for b in specdec.backends() if b in OPT_IN
               and not any(d["backend"] == b for d in specdec.devices())]
    if not missing:
        pytest.skip("every GPU backend of this build found a device (or it has none)")
    assert f"{missing[0]}: compiled in, but no {missing[0]} device found" in specdec.system_info()
    for kw in (dict(n_gpu_layers=-1), dict(n_gpu_layers=1), dict(main_gpu=1),
               dict(tensor_split=[1.0])):
        with pytest.raises(ValueError, match=f"this build has {missing[0]}.*but no such device"):
            Model(gemma_path, **kw)
    assert len(Decoder(gemma_path).generate("Hello", max_tokens=4).tokens) == 4
