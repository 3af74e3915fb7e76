"""Property-based fuzzing of the public API (hypothesis): odd prompts, parameters, token ids,
drafter outputs and core calls either work or raise a clear Python exception, and the
decoder stays usable and correct afterwards.

CI runs ``SPECDEC_FUZZ_CASES`` (default 150) cases per target (a third of that for the Engine,
whose cases are batches of requests); the long run is
``SPECDEC_FUZZ_CASES=2000 pytest tests/test_fuzz_api.py``.
"""
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec import Batch, Context, Decoder, DrafterError
from specdec.drafters import Drafter

N_CASES = int(os.environ.get("SPECDEC_FUZZ_CASES", "150"))
SETTINGS = settings(max_examples=N_CASES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
#: what a bad input may raise: a clear Python error, never anything else (an integer out of
#: range is a ValueError, never an OverflowError)
CLEAR = (ValueError, TypeError, DrafterError)
COUNT = {}

REF_PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


def _counted(name):
    COUNT[name] = COUNT.get(name, 0) + 1


def _ran(name, n):
    print(f"\n{name}: {COUNT.get(name, 0)} cases, 0 crashes")
    assert COUNT.get(name, 0) >= n // 2


@pytest.fixture(scope="module")
def setup(tiny_dense_path):
    model = specdec.Model(tiny_dense_path)
    ref = Decoder(model, n_ctx=128).generate(REF_PROMPT, max_tokens=12).tokens
    return model, ref


def _still_correct(dec, ref):
    assert not dec._lock.locked(), "the decoder was left locked"
    assert dec.generate(REF_PROMPT, max_tokens=12).tokens == ref


texts = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()),
            max_size=40),
    st.sampled_from(["", "\0", "\0\0abc\0", "\ud800", "\udfff x", "\U0010ffff" * 5, "<|im_start|>",
                     "\u202e\u200b\ufeff", "tok_1tok_2" * 50, "a" * 3000, "\r\n\t\x0b\x0c"]),
)
ids = st.one_of(st.integers(-2**40, 2**40), st.integers(-3, 300), st.booleans(), st.floats(),
                st.none(), st.text(max_size=3), st.builds(np.int32, st.integers(-5, 300)),
                st.builds(np.int64, st.integers(-2**33, 2**33)))
prompts = st.one_of(texts, st.binary(max_size=80), st.lists(ids, max_size=20),
                    st.lists(st.integers(0, 255), min_size=1, max_size=200),
                    st.tuples(st.integers(0, 255), st.integers(0, 255)))
numbers = st.one_of(st.integers(-2**40, 2**40), st.floats(), st.booleans(), st.none(),
                    st.text(max_size=3), st.integers(-2, 40))
samplings = st.one_of(
    st.none(), st.just("greedy"), st.text(max_size=6), numbers,
    st.dictionaries(st.sampled_from(["temperature", "top_k", "top_p", "min_p", "seed", "bogus"]),
                    numbers, max_size=4),
    st.builds(dict, temperature=st.floats(0.1, 2.0), top_k=st.integers(0, 300),
              top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 0.5), seed=st.integers(0, 2**63)),
)
stops = st.one_of(st.just(()), texts, st.lists(texts, max_size=3), st.binary(max_size=5), numbers,
                  st.lists(st.one_of(texts, st.binary(max_size=3), numbers), max_size=3))


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_generate_parameters(n, setup):
    model, ref = setup
    dec = Decoder(model, drafter="ngram", n_max=3, n_ctx=256)

    @SETTINGS
    @given(prompt=prompts, max_tokens=numbers, sampling=samplings, stop=stops,
           stop_ids=st.one_of(st.just(()), st.lists(ids, max_size=3), numbers),
           how=st.sampled_from(["generate", "stream", "batch"]))
    def case(prompt, max_tokens, sampling, stop, stop_ids, how):
        _counted("generate")
        try:
            if how == "generate":
                r = dec.generate(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                 stop_token_ids=stop_ids)
            elif how == "stream":
                s = dec.stream(prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                               stop_token_ids=stop_ids)
                text = "".join(s)
                r = s.result
                assert text == r.text
            else:
                r = dec.generate_batch([prompt], max_tokens=max_tokens, sampling=sampling,
                                       stop=stop, stop_token_ids=stop_ids)[0]
        except CLEAR as e:
            assert str(e), f"{type(e).__name__} without a message"
            assert not dec._lock.locked()
            return
        assert isinstance(r.text, str) and r.finish_reason in ("stop", "length", "eos", "context")
        assert all(0 <= t < model.n_vocab for t in r.tokens)
        assert len(r.tokens) <= max_tokens
        assert not set(r.tokens) & set(stop_ids or ())

    case()
    _ran("generate", n)
    _still_correct(dec, ref)


class Junk(Drafter):
    """Returns whatever the test hands it."""

    def __init__(self):
        super().__init__("junk")
        self.answer = []

    def propose(self, seq, last_token, n_max):
        a = self.answer
        return a() if callable(a) else a


def _dist(n_vocab):
    dense = st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0,
                     max_size=3).map(lambda v: np.resize(np.asarray(v or [0.0], np.float32), n_vocab))
    good = st.integers(0, n_vocab - 1).map(lambda t: np.eye(n_vocab, dtype=np.float32)[t])
    sparse = st.dictionaries(ids, st.one_of(st.floats(), numbers), max_size=4)
    return st.one_of(dense, good, sparse, st.lists(st.floats(), max_size=5), numbers,
                     st.just(np.full(n_vocab, 1.0 / n_vocab)), st.just(np.ones(n_vocab) * 7))


def _answers(n_vocab):
    toks = st.lists(st.one_of(st.integers(0, n_vocab - 1), ids), max_size=8)
    valid = st.lists(st.integers(0, n_vocab - 1), max_size=4)
    return st.one_of(
        toks, valid, numbers, texts, st.binary(max_size=4),
        st.builds(lambda t: np.asarray(t, dtype=np.int64), valid),
        st.builds(lambda t: np.asarray(t, dtype=np.float32), valid),
        st.tuples(valid, st.lists(_dist(n_vocab), max_size=5)),
        st.tuples(toks, st.lists(_dist(n_vocab), max_size=3)),
        st.tuples(valid), st.tuples(valid, valid, valid),
        st.sampled_from([ZeroDivisionError("x"), KeyError("k"), RecursionError("r"),
                         StopIteration(), MemoryError("m"), AttributeError("a")]).map(
            lambda e: (lambda: (_ for _ in ()).throw(e))),
    )


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_drafter_outputs(n, setup):
    model, ref = setup
    junk = Junk()
    dec = Decoder(model, drafter=junk, n_max=4, n_ctx=128)

    @SETTINGS
    @given(answer=_answers(model.n_vocab), sampled=st.booleans())
    def case(answer, sampled):
        _counted("drafter")
        junk.answer = answer
        sampling = {"temperature": 0.8, "seed": 1} if sampled else None
        try:
            r = dec.generate(REF_PROMPT, max_tokens=6, sampling=sampling)
        except (DrafterError, MemoryError) as e:
            assert str(e) or isinstance(e, MemoryError)
            assert not dec._lock.locked()
            return
        assert all(0 <= t < model.n_vocab for t in r.tokens)
        if not sampled:   # whatever the draft, greedy output is the target's own
            assert r.tokens == ref[:6]

    case()
    _ran("drafter", n)
    junk.answer = []
    _still_correct(dec, ref)


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_core_calls(n, setup):
    """Model / Batch / Context methods with bad token ids, positions, sequences and states."""
    model, ref = setup
    ctx = Context(model, n_ctx=64, n_batch=16, n_seq_max=2)
    good = Batch(4, n_seq_max=2)
    for i, t in enumerate([1, 2, 3]):
        good.add(t, i, 0, output=i == 2)
    ctx.decode(good)
    state = ctx.save_state(0)

    def corrupt(data):
        return st.one_of(st.binary(max_size=64), st.just(data[: len(data) // 2]),
                         st.integers(0, len(data) - 1).map(
                             lambda k: data[:k] + bytes([data[k] ^ 0xFF]) + data[k + 1:]),
                         st.just(data + b"\0" * 7), st.just(b"\xff" * len(data)))

    ops = st.one_of(
        st.tuples(st.just("tokenize"), st.one_of(texts, st.binary(max_size=40), numbers)),
        st.tuples(st.just("detokenize"), st.lists(ids, max_size=6)),
        st.tuples(st.just("piece"), ids),
        st.tuples(st.just("eog"), ids),
        st.tuples(st.just("batch"), st.lists(st.tuples(ids, numbers, st.one_of(ids, st.lists(ids, max_size=3)),
                                                         st.booleans()), max_size=6)),
        st.tuples(st.just("seq_rm"), st.tuples(numbers, numbers, numbers)),
        st.tuples(st.just("seq_cp"), st.tuples(numbers, numbers, numbers, numbers)),
        st.tuples(st.just("logits"), numbers),
        st.tuples(st.just("load_state"), st.tuples(corrupt(state), numbers)),
        st.tuples(st.just("batch_new"), st.tuples(numbers, numbers, numbers)),
    )

    @SETTINGS
    @given(op=ops)
    def case(op):
        _counted("core")
        name, arg = op
        try:
            if name == "tokenize":
                model.tokenize(arg, add_special=True, parse_special=True)
            elif name == "detokenize":
                model.detokenize(arg)
            elif name == "piece":
                model.token_to_piece(arg)
            elif name == "eog":
                model.is_eog(arg)
            elif name == "batch":
                b = Batch(8, n_seq_max=2)
                for tok, pos, seqs, out in arg:
                    b.add(tok, pos, seqs, out)
                ctx.decode(b)
            elif name == "seq_rm":
                ctx.seq_rm(*arg)
            elif name == "seq_cp":
                ctx.seq_cp(*arg)
            elif name == "logits":
                ctx.logits(arg)
            elif name == "load_state":
                ctx.load_state(*arg)
            else:
                Batch(arg[0], n_embd=arg[1], n_seq_max=arg[2])
        except (*CLEAR, IndexError, specdec.DecodeError) as e:
            assert str(e), f"{type(e).__name__} without a message"

    case()
    _ran("core", n)
    # the context still decodes correctly from a clean state
    ctx.clear()
    ctx.decode(good)
    plain = Context(model, n_ctx=64, n_batch=16)
    plain.decode(good)
    assert int(np.argmax(ctx.logits(2))) == int(np.argmax(plain.logits(2)))


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_decoder_options(n, setup, tiny_dense_path):
    """Decoder construction with odd options: a clear error, or a decoder that works."""
    model, ref = setup

    @SETTINGS
    @given(opts=st.fixed_dictionaries({}, optional={
        "n_max": numbers, "n_min": numbers, "p_min": numbers, "n_ctx": numbers,
        "n_batch": numbers, "n_seq_max": st.one_of(numbers, st.integers(1, 4)),
        "drafter": st.one_of(st.sampled_from(["ngram", "ngram:2", "ngram:0", "ngram:x", "suffix",
                                              "ngram-map", "nope", "", ":", "ngram-cache",
                                              f"draft:{tiny_dense_path}", "draft:/nonexistent"]),
                             numbers, st.lists(st.sampled_from(["ngram", "suffix", "nope"]), max_size=3)),
        "adaptive": st.booleans(), "n_threads": numbers}))
    def case(opts):
        _counted("options")
        try:
            dec = Decoder(model, **opts)
        except (*CLEAR, FileNotFoundError) as e:
            assert str(e)
            return
        try:
            r = dec.generate(REF_PROMPT, max_tokens=4)
        except specdec.ContextFullError:    # n_ctx is the size asked for, however small
            assert dec.ctx.n_ctx_seq <= len(REF_PROMPT)
            return
        assert r.tokens[:len(r.tokens)] == ref[:len(r.tokens)]

    case()
    _ran("options", n)


@pytest.mark.parametrize("n", [max(N_CASES // 3, 10)], ids=lambda n: f"{n}-cases")
def test_fuzz_engine_requests(n, tiny_dense_path):
    """Batches of Engine requests with odd options, some cancelled: a bad one raises at
    ``submit`` (a clear error), the others all finish, each greedy one equal to the Decoder
    alone (both exact), and the engine ends idle."""
    model = specdec.Model(tiny_dense_path, use_extra_bufts=False)
    eng = specdec.Engine(model, drafters=["ngram", "suffix"], n_slots=3, n_ctx=256, n_max=4,
                         exact=True)
    alone = Decoder(model, n_ctx=256, exact=True)

    def mostly(valid, odd):
        """``valid`` three times in four: a batch is mostly requests that run."""
        return st.one_of(valid, valid, valid, odd)

    request = st.fixed_dictionaries(
        {"prompt": mostly(st.one_of(st.lists(st.integers(1, 255), min_size=1, max_size=40),
                                    st.lists(st.integers(1, 6), min_size=1, max_size=30)),
                          prompts)},
        optional={"max_tokens": mostly(st.integers(1, 30), numbers),
                  "sampling": mostly(st.none(), samplings),
                  "stop": mostly(st.lists(st.sampled_from(["\n", "a", "tok", "\ud800", "é"]),
                                          min_size=1, max_size=2), stops),
                  "stop_token_ids": mostly(st.lists(st.integers(0, 255), max_size=4),
                                           st.one_of(st.lists(ids, max_size=2), numbers)),
                  "drafter": mostly(st.sampled_from(["ngram", "suffix", "plain", "default",
                                                     ("ngram", "suffix")]),
                                    st.one_of(st.just("nope"), numbers)),
                  "n_max": mostly(st.integers(0, 4), st.one_of(st.integers(-1, 6), numbers)),
                  "logprobs": mostly(st.one_of(st.booleans(), st.integers(0, 20)),
                                     st.one_of(st.integers(-1, 21), numbers)),
                  "timeout": mostly(st.just(30.0), st.one_of(st.sampled_from([0.0, -1.0]),
                                                             numbers))})

    @SETTINGS
    @given(reqs=st.lists(st.tuples(request, st.booleans()), min_size=1, max_size=6))
    def case(reqs):
        _counted("engine")
        running = []
        for kw, cancel in reqs:
            kw = dict(kw)
            prompt = kw.pop("prompt")
            try:
                h = eng.submit(prompt, **kw)
            except CLEAR as e:
                assert str(e), f"{type(e).__name__} without a message"
                continue
            if cancel:
                h.cancel()
            running.append((prompt, kw, h))
        for prompt, kw, h in running:
            r = h.result(timeout=60)
            assert all(0 <= t < model.n_vocab for t in r.tokens)
            assert not set(r.tokens) & set(kw.get("stop_token_ids") or ())
            if r.finish_reason in ("cancelled", "timeout") or \
                    not specdec.Sampling.resolve(kw.get("sampling")).greedy:
                continue
            ref = alone.generate(prompt, **{k: v for k, v in kw.items()
                                            if k in ("max_tokens", "stop", "stop_token_ids")})
            assert (r.tokens, r.finish_reason) == (ref.tokens, ref.finish_reason)

    try:
        case()
        deadline = time.monotonic() + 30
        while (eng.n_running or eng.n_queued) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert eng.n_running == 0 and eng.n_queued == 0
    finally:
        eng.close()
    _ran("engine", n)


def test_n_min_past_n_max_is_refused(setup):
    """Found by the long run (2,500 cases): ``n_min=2**31`` built a Decoder whose first
    ``generate`` raised OverflowError in the controller; an n_min above n_max never drafts."""
    model, ref = setup
    for n_min in (2 ** 31, 5):
        with pytest.raises(ValueError, match="n_min must be at most n_max"):
            Decoder(model, drafter="ngram", n_max=4, n_min=n_min)
    assert Decoder(model, drafter="ngram", n_max=4, n_min=4).generate(REF_PROMPT, max_tokens=4).tokens == ref[:4]


# --- limits llama.cpp asserts, views, entry points, drafters poking at the target ------------

#: sizes around the limits llama.cpp asserts or pads to; never a context of 2**24 positions
sizes = st.one_of(st.integers(-2, 70), numbers.filter(lambda v: not isinstance(v, int) or v < 2**14
                                                      or v >= 2**31),
                  st.sampled_from([0, 1, 2, 8, 255, 256, 257, 300, 1000, 1001, 1002, 1003, 2**31,
                                   2**32, 2**63]))


@pytest.fixture(scope="module")
def qwen35(tiny_qwen35_nomtp_path):
    return specdec.Model(tiny_qwen35_nomtp_path)


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_context_limits(n, setup, qwen35):
    """Contexts of odd sizes (n_ctx, n_batch, n_ubatch, n_seq_max, n_rollback, n_outputs_max),
    then decodes with any number of tokens and output rows, rollbacks, views kept across
    close(): a clear error or a working context, and views that still read."""
    dense, _ = setup
    models = {"dense": dense, "qwen35": qwen35}

    @SETTINGS
    @given(which=st.sampled_from(sorted(models)),
           opts=st.fixed_dictionaries({}, optional={
               "n_ctx": sizes, "n_batch": sizes, "n_ubatch": sizes,
               "n_seq_max": st.one_of(st.integers(1, 4), sizes), "n_rollback": sizes,
               "n_outputs_max": sizes, "kv_unified": st.booleans()}),
           steps=st.lists(st.tuples(st.sampled_from(["decode", "decode", "rollback", "view",
                                                     "close"]),
                                    st.integers(1, 80), st.integers(0, 80), st.integers(0, 3)),
                          max_size=5))
    def case(which, opts, steps):
        _counted("limits")
        try:
            ctx = Context(models[which], n_threads=1, **opts)
        except CLEAR as e:
            assert str(e)
            return
        pos = [0] * ctx.n_seq_max
        views = []
        for op, k, n_out, seq in steps:
            seq %= ctx.n_seq_max
            try:
                if op == "decode":
                    b = Batch(k, n_seq_max=ctx.n_seq_max)
                    for i in range(k):
                        b.add(1 + (i * 7) % 50, pos[seq] + i, seq, i >= k - n_out)
                    ctx.decode(b)
                    pos[seq] += k
                elif op == "rollback":
                    keep = max(0, pos[seq] - n_out)
                    if ctx.seq_rm(seq, keep, -1):
                        pos[seq] = keep
                elif op == "view":
                    views.append((ctx.logits(-1), None))
                else:
                    ctx.close()
            except (*CLEAR, IndexError, specdec.DecodeError, RuntimeError) as e:
                assert str(e)
                if isinstance(e, specdec.DecodeError):
                    return
            for v, _ in views:      # views read, whatever happened since (close included)
                assert v.shape == (ctx.n_vocab,)
                float(v.sum())

    case()
    _ran("limits", n)


ANY = st.one_of(numbers, texts, st.binary(max_size=8), st.none(), st.lists(ids, max_size=4),
                st.just(object()), st.sampled_from([2**31, -2**31 - 1, 2**63, 2**64, -1, 0, 1]))


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_entry_points(n, setup, qwen35):
    """Every public method of Model, Batch and Context with arguments of any type and size."""
    dense, ref = setup
    state = {}

    def fresh():
        state["ctx"] = Context(dense, n_ctx=256, n_batch=32, n_seq_max=2)
        b = Batch(4, n_seq_max=2)
        for i, t in enumerate([1, 2, 3]):
            b.add(t, i, 0, output=True)
        state["ctx"].decode(b)

    fresh()
    targets = {"model": lambda: dense, "qwen35": lambda: qwen35, "ctx": lambda: state["ctx"],
               "batch": lambda: Batch(8, n_seq_max=2)}
    names = {k: sorted(a for a in dir(f()) if not a.startswith("_") and callable(getattr(f(), a)))
             for k, f in targets.items()}

    @SETTINGS
    @given(which=st.sampled_from(sorted(targets)), data=st.data(),
           args=st.lists(ANY, max_size=4),
           kwargs=st.dictionaries(st.sampled_from(["i", "seq", "partial", "add_special", "special",
                                                   "remove_special", "n", "p0", "p1", "data"]),
                                  ANY, max_size=2))
    def case(which, data, args, kwargs):
        _counted("entry")
        obj = targets[which]()
        name = data.draw(st.sampled_from(names[which]))
        try:
            getattr(obj, name)(*args, **kwargs)
        except (*CLEAR, IndexError, KeyError, RuntimeError, FileNotFoundError,
                specdec.DecodeError) as e:
            assert str(e) or isinstance(e, KeyError)
        if which == "ctx" and name in ("close", "clear", "seq_rm", "seq_keep", "load_state",
                                       "seq_cp", "decode", "set_mtp_hidden", "set_threads"):
            fresh()

    case()
    _ran("entry", n)
    assert Decoder(dense, n_ctx=128).generate(REF_PROMPT, max_tokens=12).tokens == ref


class Poker(Drafter):
    """Calls whatever the test hands it on its target, then drafts from its history."""

    def __init__(self):
        super().__init__("poker")
        self.poke = None

    def propose(self, seq, last_token, n_max):
        if self.poke is not None:
            name, args = self.poke
            getattr(self.target, name)(*args)
        return self.history(seq)[-n_max:]


@pytest.mark.parametrize("n", [N_CASES], ids=lambda n: f"{n}-cases")
def test_fuzz_drafter_target_access(n, setup):
    """A drafter calling any attribute of its target, with any arguments: reads work, changes
    raise, and greedy output stays the target's own."""
    dense, ref = setup
    poker = Poker()
    dec = Decoder(dense, drafter=poker, n_max=4, n_ctx=128)
    names = sorted(set(dir(Context)) | {"_ctx", "model", "tokenize", "nope"})

    @SETTINGS
    @given(name=st.sampled_from(names), args=st.lists(ANY, max_size=3))
    def case(name, args):
        _counted("poke")
        poker.poke = (name, args)
        try:
            r = dec.generate(REF_PROMPT, max_tokens=12)
        except DrafterError as e:
            assert str(e)
            assert not dec._lock.locked()
            return
        assert r.tokens == ref

    case()
    _ran("poke", n)
    poker.poke = None
    _still_correct(dec, ref)
