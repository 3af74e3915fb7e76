"""The n-gram cache drafter (llama.cpp ngram-cache): context / dynamic / static caches,
persistence across requests, llama.cpp's file format, and lossless greedy output."""
import struct

import pytest

from specdec import Context, Decoder
from specdec.drafters import create
from specdec.drafters._run import run_begin, run_observe, run_propose


@pytest.fixture(scope="module")
def ctx(tiny_dense):
    return Context(tiny_dense, n_ctx=64)


def _drafter(ctx, *args, **kw):
    d = create("ngram-cache", *args, **kw) if not args else create(f"ngram-cache:{args[0]}", **kw)
    d.bind(ctx, 1)
    return d


def _start(d, prompt, seq=0):
    run_begin(d, seq, prompt)
    run_observe(d, seq, prompt)


def write_cache(path, cache):
    """llama.cpp's common_ngram_cache_save layout: int32 tokens[4] (-1 padded),
    int32 n, then n (int32 token, int32 count) pairs, little-endian here."""
    with open(path, "wb") as f:
        for gram, followers in cache.items():
            f.write(struct.pack("<4i", *(list(gram) + [-1] * (4 - len(gram)))))
            f.write(struct.pack("<i", len(followers)))
            for tok, cnt in followers.items():
                f.write(struct.pack("<2i", tok, cnt))


def read_cache(path):
    out = {}
    data = open(path, "rb").read()
    off = 0
    while off < len(data):
        gram = tuple(t for t in struct.unpack_from("<4i", data, off) if t != -1)
        (n,) = struct.unpack_from("<i", data, off + 16)
        off += 20
        pairs = struct.unpack_from(f"<{2 * n}i", data, off)
        off += 8 * n
        assert gram not in out
        out[gram] = dict(zip(pairs[::2], pairs[1::2]))
    return out


def llama_update(seq, kmin=1, kmax=4):
    """common_ngram_cache_update over a whole sequence, in Python."""
    c = {}
    for k in range(kmin, kmax + 1):
        for i in range(k, len(seq)):
            part = c.setdefault(tuple(seq[i - k:i]), {})
            part[seq[i]] = part.get(seq[i], 0) + 1
    return c


def test_options():
    d = create("ngram-cache")
    assert (d.ngram_min, d.ngram_max, d.static_path, d.dynamic_path) == (1, 4, None, None)
    assert d.name == "ngram-cache" and d.update_dynamic
    for bad in ({"ngram_min": 0}, {"ngram_max": 5}, {"ngram_min": 3, "ngram_max": 2},
                {"max_entries": 0}):
        with pytest.raises(ValueError):
            create("ngram-cache", **bad)


def test_context_lookup_up_to_n_max(ctx):
    d = _drafter(ctx)
    _start(d, [1, 2, 3, 1, 2, 3, 1, 2])
    assert run_propose(d, 0, 3, 5) == [1, 2, 3, 1, 2]
    assert run_propose(d, 0, 3, 12) == [1, 2, 3] * 4
    assert run_propose(d, 0, 9, 5) == []


def test_context_thresholds(ctx):
    # 1-grams need 2 samples and a 66% majority in the context cache
    d = _drafter(ctx)
    _start(d, [5, 6, 1, 5, 7, 2])
    assert run_propose(d, 0, 5, 4) == []          # [5] -> 6 once, 7 once
    d = _drafter(ctx)
    _start(d, [5, 6, 1, 5, 6, 2])
    assert run_propose(d, 0, 5, 1) == [6]         # [5] -> 6 twice


def test_pending_token_is_counted_once(ctx):
    d = _drafter(ctx)
    _start(d, [10, 11])
    run_propose(d, 0, 10, 4)                      # the pending 10 joins the context ...
    run_observe(d, 0, [10])                       # ... and is not counted again on arrival:
    assert run_propose(d, 0, 11, 4) == []         # [11] -> 10 once, below a 1-gram's 2 samples
    run_observe(d, 0, [12])                       # not what was pending: 11 is taken back
    want = llama_update([10, 11, 10, 12])
    assert d.stats()["context_entries"] == sum(len(p) for p in want.values())


def test_dynamic_cache_persists_across_requests(ctx):
    d = _drafter(ctx)
    _start(d, [10, 11, 12, 13] * 3)
    fresh = _drafter(ctx)
    _start(fresh, [50, 10])
    assert run_propose(fresh, 0, 11, 4) == []
    # the next request on the drafter sees the previous one through its dynamic cache
    _start(d, [50, 10])
    assert d.stats()["dynamic_entries"] > 0
    assert run_propose(d, 0, 11, 4) == [12, 13, 10, 11]


def test_save_load_round_trip(ctx, tmp_path):
    path = tmp_path / "dynamic.bin"
    d = _drafter(ctx, dynamic_path=path)
    seq = [10, 11, 12, 13] * 3
    _start(d, seq)
    d.save()                                      # flushes the running request first
    assert read_cache(path) == llama_update(seq)
    d.save(tmp_path / "again.bin")                # a second flush adds nothing
    assert read_cache(tmp_path / "again.bin") == llama_update(seq)

    e = _drafter(ctx, dynamic_path=path)          # loaded at construction
    _start(e, [50, 10])
    assert run_propose(e, 0, 11, 4) == [12, 13, 10, 11]
    assert e.stats()["dynamic_entries"] == sum(len(p) for p in llama_update(seq).values())

    e.load(path, merge=True)                      # counts add up
    e.save(tmp_path / "merged.bin")
    doubled = {g: {t: 2 * c for t, c in p.items()} for g, p in llama_update(seq).items()}
    merged = read_cache(tmp_path / "merged.bin")
    for g, p in doubled.items():
        assert merged[g] == p                     # (plus request [50, 10]'s own n-grams)


def test_load_errors_leave_the_cache_unchanged(ctx, tmp_path):
    d = _drafter(ctx)
    _start(d, [10, 11, 12, 13] * 3)
    d.flush()
    before = d.stats()
    with pytest.raises(FileNotFoundError):
        d.load(tmp_path / "missing.bin")
    bad = tmp_path / "bad.bin"
    write_cache(bad, {(1, 2): {3: 1}})
    bad.write_bytes(bad.read_bytes()[:-4])        # truncated record
    with pytest.raises(ValueError, match="not a llama.cpp ngram-cache file"):
        d.load(bad)
    bad.write_bytes(struct.pack("<4i", -1, 5, -1, -1) + struct.pack("<3i", 1, 3, 1))
    with pytest.raises(ValueError):
        d.load(bad)
    # a cut inside a record's first int32 or inside a (token, count) pair
    good = tmp_path / "good.bin"
    write_cache(good, {(1, 2): {3: 1}})
    for tail in (b"\x01", b"\x01\x00\x00", struct.pack("<5i", 1, 2, -1, -1, 1) + b"\x03\x00"):
        bad.write_bytes(good.read_bytes() + tail)
        with pytest.raises(ValueError, match="not a llama.cpp ngram-cache file"):
            d.load(bad)
    bad.write_bytes(b"\x01\x00")
    with pytest.raises(ValueError, match="not a llama.cpp ngram-cache file"):
        d.load(bad)
    assert d.stats() == before
    with pytest.raises(ValueError):
        create("ngram-cache").save()              # no path anywhere


def test_static_cache_validates_and_fills_in(ctx, tmp_path):
    static = tmp_path / "static.bin"
    write_cache(static, {(5, 6): {7: 5}, (6, 7): {1: 1}})
    history = [5, 6, 8, 1, 5, 6, 8, 2, 5, 6, 7, 3, 5]
    plain = _drafter(ctx)
    _start(plain, history)
    assert run_propose(plain, 0, 6, 1) == [8]     # context: [5, 6] -> 8 twice, 7 once
    d = _drafter(ctx, str(static))                # "ngram-cache:PATH" is the static cache
    assert d.static_path == str(static)
    _start(d, history)
    # 7 outweighs 8 but is no majority in the context; the static cache proposes it
    assert run_propose(d, 0, 6, 1) == [7]
    only_static = _drafter(ctx, static_path=static)
    _start(only_static, [9, 5])
    # then [6, 7] -> 1 is a single sample: too few for the static cache alone
    assert run_propose(only_static, 0, 6, 4) == [7]
    assert only_static.stats()["static_entries"] == 2


def test_max_entries_bounds_the_dynamic_cache(ctx):
    d = _drafter(ctx, max_entries=100)
    patterns = [[10 * r + i for i in range(10)] for r in range(5)]
    for p in patterns:
        _start(d, p * 2)                          # about 40 (n-gram, token) pairs each
    _start(d, [200] + patterns[-1][:2])
    assert 0 < d.stats()["dynamic_entries"] <= 100
    # the n-grams of the latest requests stay, the oldest go first
    assert run_propose(d, 0, patterns[-1][2], 4) == patterns[-1][3:7]
    _start(d, [200] + patterns[0][:2])
    assert run_propose(d, 0, patterns[0][2], 4) == []
    unbounded = _drafter(ctx, max_entries=None)
    for p in patterns:
        _start(unbounded, p * 2)
    _start(unbounded, [200] + patterns[0][:2])
    assert run_propose(unbounded, 0, patterns[0][2], 4) == patterns[0][3:7]


@pytest.mark.parametrize("n_max", [1, 3, 6])
def test_greedy_equal_to_plain_synthetic(tiny_dense, n_max):
    prompt = list(range(3, 40)) * 3
    plain = Decoder(tiny_dense, n_ctx=512).generate(prompt, max_tokens=64)
    dec = Decoder(tiny_dense, drafter="ngram-cache", n_max=n_max, n_ctx=512, check=True)
    first = dec.generate(prompt, max_tokens=64)
    second = dec.generate(prompt, max_tokens=64)   # now with a dynamic cache
    assert first.tokens == plain.tokens
    assert second.tokens == plain.tokens
    assert first.stats.drafted > 0
    assert second.stats.accepted >= first.stats.accepted


def test_gemma_repetitive_prompt(gemma):
    prompt = "The quick brown fox jumps over the lazy dog. " * 6 + "The quick"
    plain = Decoder(gemma, n_ctx=1024).generate(prompt, max_tokens=60)
    res = Decoder(gemma, drafter="ngram-cache", n_max=8, n_ctx=1024, check=True).generate(
        prompt, max_tokens=60)
    assert res.stats.accepted > 0
    assert res.stats.rounds < 60
    # batched verification may flip near-ties on quantized weights: compare a prefix
    assert res.tokens[:20] == plain.tokens[:20]
