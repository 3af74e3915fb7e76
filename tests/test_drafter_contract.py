"""The drafter contract: the dispatch rule for every built-in and every hook, the settings
every drafter takes from the decoder, the history view, state, and the declared registry."""
import ast
import gc
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from specdec import Decoder
from specdec.config import SpecConfig
from specdec.drafters import BUILTINS, Drafter, create, get
from specdec.drafters._run import run_begin, run_observe, run_propose, run_reset
from specdec.drafters.guard import GuardedDrafter

HOOKS = ("begin", "observe", "propose", "accept", "reset")
REPEAT = list(range(3, 40)) * 3
DRAFTERS = Path(__file__).resolve().parent.parent / "specdec" / "drafters"


@pytest.fixture
def setup(request, tiny_dense_path, bigram_tiny_path, tmp_path, monkeypatch):
    """setup(name) -> (model path, constructor args, prompt) under which the built-in drafts."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))

    def get_setup(name):
        if name == "mtp":
            return bigram_tiny_path, (), [1, 2, 3]
        if name == "eagle3":
            from specdec.testing.eagle3 import write_eagle3_draft
            head = write_eagle3_draft(tmp_path / "eagle3.gguf", bigram_tiny_path)
            return bigram_tiny_path, (str(head),), [1, 2, 3]
        if name == "dflash":
            from specdec.testing import write_bigram_mtp_model, write_dflash_draft
            periodic = write_bigram_mtp_model(tmp_path / "periodic.gguf", period=16)
            block = write_dflash_draft(tmp_path / "dflash.gguf", periodic)
            return str(periodic), (str(block),), [1, 2, 3]
        args = {"draft": (tiny_dense_path,), "layerskip": (1,), "ngram-map": (1, 4),
                "ngram-map-k4v": (1, 4)}.get(name, ())
        return tiny_dense_path, args, REPEAT
    return get_setup


def _recording(cls):
    """A Python subclass of ``cls`` overriding every hook: records the call, then defers to
    the built-in through ``super()``."""
    def hook(name):
        def f(self, *args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(super(Rec, self), name)(*args)
        f.__name__ = name
        return f

    def __init__(self, *args, **kw):
        cls.__init__(self, *args, **kw)
        self.calls = {}

    Rec = type(f"Recording{cls.__name__}", (cls,), {"__init__": __init__,
                                                   **{h: hook(h) for h in HOOKS}})
    return Rec


def _generate(model, drafter, prompt, n=24):
    dec = Decoder(model, drafter=drafter, n_max=3, n_ctx=512, load_mtp=True)
    res = dec.generate(prompt, max_tokens=n)
    return dec, res


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_hook_of_every_builtin_honours_a_python_override(setup, name):
    model, args, prompt = setup(name)
    cls = get(name)
    _, base = _generate(model, cls(*args), prompt)
    assert base.stats.drafted > 0, f"{name} must draft here for the test to mean anything"

    rec = _recording(cls)(*args)
    dec, res = _generate(model, rec, prompt)
    # every hook the controller calls went through the override ...
    assert {h: rec.calls.get(h, 0) > 0 for h in HOOKS if h != "reset"} == \
        {h: True for h in HOOKS if h != "reset"}, rec.calls
    # ... and super() reached the built-in's own implementation: the same drafts
    assert res.tokens == base.tokens
    assert (res.stats.drafted, res.stats.accepted) == (base.stats.drafted, base.stats.accepted)
    run_reset(dec.drafters[0], 0)
    assert rec.calls["reset"] == 1 and len(rec.history(0)) == 0

    class Silent(cls):
        """propose replaced outright: the built-in never drafts."""

        def propose(self, seq, last_token, n_max):
            return []

    _, res = _generate(model, Silent(*args), prompt)
    assert res.stats.drafted == 0 and res.tokens == base.tokens


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_python_propose_of_a_builtin_can_amend_its_draft(setup, name):
    """The override's answer is what is verified (checked like any Python drafter's)."""
    model, args, prompt = setup(name)
    cls = get(name)

    class FirstOnly(cls):
        def propose(self, seq, last_token, n_max):
            return super().propose(seq, last_token, n_max)[:1]

    _, res = _generate(model, FirstOnly(*args), prompt)
    assert 0 < res.stats.drafted <= res.stats.draft_rounds


def test_plain_drafter_without_propose_is_an_error(tiny_dense):
    class Nothing(Drafter):
        pass

    with pytest.raises(Exception, match="must implement propose"):
        Decoder(tiny_dense, drafter=Nothing(), n_ctx=256).generate([1, 2, 3], max_tokens=4)


# --- settings from the decoder --------------------------------------------------------

@pytest.mark.parametrize("make,default", [
    (lambda p, **kw: create(f"draft:{p}", **kw), 0.0),
    (lambda p, **kw: create("mtp", **kw), 0.0),
    (lambda p, **kw: create("layerskip:1", **kw), 0.0),
])
def test_p_min_unless_given(tiny_dense_path, make, default):
    d = make(tiny_dense_path)
    assert d.p_min == default and d.n_max == 0
    d.configure(SpecConfig(n_max=5, p_min=0.4))
    assert d.p_min == pytest.approx(0.4) and d.n_max == 5 and d.rollback_depth == 5
    own = make(tiny_dense_path, p_min=0.25)
    own.configure(SpecConfig(n_max=5, p_min=0.4))
    assert own.p_min == 0.25
    with pytest.raises(ValueError, match="p_min"):
        make(tiny_dense_path, p_min=1.5)


def test_suffix_min_prob_is_its_p_min():
    d = create("suffix")
    d.configure(SpecConfig(p_min=0.0))
    assert d.min_prob == d.p_min == pytest.approx(0.1)        # the drafter's default
    d.configure(SpecConfig(p_min=0.3))
    assert d.min_prob == pytest.approx(0.3)
    own = create("suffix", min_prob=0.05)
    own.configure(SpecConfig(p_min=0.3))
    assert own.min_prob == pytest.approx(0.05)


def test_contract_defaults():
    class Mine(Drafter):
        def propose(self, seq, last_token, n_max):
            return []

    d = Mine()
    assert not d.needs_mtp_hidden and not d.has_model and d.rollback_depth == 0
    assert d.get_state() is None
    d.set_state(None)
    with pytest.raises(ValueError, match="keeps no state"):
        d.set_state(b"x")
    d.forget_text()
    d.close()
    g = GuardedDrafter(create("mtp"), timeout=1.0)
    assert g.needs_mtp_hidden and g.has_model
    assert not hasattr(g, "no_such_attribute")      # no passthrough beyond the contract


def test_close_frees_a_drafters_model_context(tiny_dense_path):
    dec = Decoder(tiny_dense_path, drafter=f"draft:{tiny_dense_path}", n_ctx=256)
    d = dec.drafters[0]
    assert d.draft_ctx is not None
    dec.close()
    assert d.draft_ctx is None


# --- persistent state -------------------------------------------------------------------

def _request(d, prompt, generated, seq=0):
    run_begin(d, seq, prompt)
    run_observe(d, seq, prompt)
    run_observe(d, seq, generated)


def test_suffix_state_round_trip():
    from specdec.drafters._test_hooks import check_suffix_tree, suffix_count
    d = create("suffix")
    d.add_corpus([[5, 6, 7, 8, 9], [20, 21, 22, 20, 21]])
    _request(d, [1, 2], [40, 41, 42, 43])
    d.finish()
    state = d.get_state()
    e = create("suffix")
    e.set_state(state)
    check_suffix_tree(e, -1)
    assert e.corpus_sequences == d.corpus_sequences == 3
    for s in ([6, 7, 8], [20, 21], [41, 42, 43], [9, 20]):
        assert suffix_count(e, s) == suffix_count(d, s)
    assert e.get_state() == state
    for bad in (b"abc", b"\x05\x00\x00\x00", np.array([1, 3, 5, -1, 2], np.int32).tobytes()):
        with pytest.raises(ValueError):
            e.set_state(bad)
    with pytest.raises(TypeError):
        e.set_state([1, 2])
    assert e.get_state() == state                  # a refused state changes nothing
    e.forget_text()
    assert e.corpus_tokens == 0


def test_ngram_cache_state_round_trip():
    d = create("ngram-cache")
    _request(d, [1, 2, 3, 4] * 4, [1, 2, 3, 4, 1, 2])
    state = d.get_state()
    assert d.stats()["dynamic_entries"] > 0
    e = create("ngram-cache")
    e.set_state(state)
    assert e.stats()["dynamic_entries"] == d.stats()["dynamic_entries"]
    run_begin(e, 0, [9, 1, 2])
    run_observe(e, 0, [9, 1, 2])
    assert run_propose(e, 0, 3, 3) == [4, 1, 2]      # from the restored cache only
    with pytest.raises(ValueError, match="ngram-cache file"):
        e.set_state(b"\x01\x00")
    e.forget_text()
    assert e.stats()["dynamic_entries"] == 0


def test_forget_text_leaves_the_running_request_out(tiny_dense):
    """After forget_text, the next request drafts from its own text only."""
    for name in ("suffix", "ngram-cache"):
        dec = Decoder(tiny_dense, drafter=name, n_max=4, n_ctx=512)
        first = dec.generate(REPEAT[:40], max_tokens=24)
        for d in dec.drafters:
            d.forget_text()
        again = dec.generate([7, 8], max_tokens=24)
        fresh = Decoder(tiny_dense, drafter=name, n_max=4, n_ctx=512).generate([7, 8], max_tokens=24)
        assert again.tokens == fresh.tokens
        assert again.stats.drafted == fresh.stats.drafted, name
        assert first.tokens


# --- the history view -------------------------------------------------------------------

def test_history_is_a_read_only_view_that_stays_valid():
    class Plain(Drafter):
        def propose(self, seq, last_token, n_max):
            return []

    d = Plain()
    run_begin(d, 0, [1, 2, 3])
    run_observe(d, 0, [1, 2, 3])
    h = d.history(0)
    assert h.dtype == np.int32 and list(h) == [1, 2, 3] and not h.flags.writeable
    with pytest.raises(ValueError):
        h[0] = 9
    assert np.shares_memory(h, d.history(0))              # no copy per call
    for i in range(1000):                                  # the storage grows past the view
        run_observe(d, 0, [i])
    assert list(h) == [1, 2, 3]                            # a snapshot, still readable
    assert len(d.history(0)) == 1003 and d.history(0)[-1] == 999
    run_begin(d, 0, [4])
    run_observe(d, 0, [4, 5])
    assert list(h) == [1, 2, 3] and list(d.history(0)) == [4, 5]
    run_reset(d, 0)
    assert len(d.history(0)) == 0 and len(d.history(7)) == 0
    del h
    gc.collect()
    a = d.history(0)
    run_observe(d, 0, [1])
    assert list(a) == [] and list(d.history(0)) == [1]


# --- the declared registry and the layers ------------------------------------------------

def _child(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=tempfile.gettempdir())
    assert p.returncode == 0, p.stderr
    return p.stdout


BASE_MODULES = {"specdec.drafters", "specdec.drafters._base", "specdec.drafters._run",
                "specdec.drafters.registry", "specdec.drafters.guard"}


def test_listing_drafters_imports_no_drafter_module():
    out = _child("import sys, contextlib, io\n"
                 "from specdec.cli import main\n"
                 "buf = io.StringIO()\n"
                 "with contextlib.redirect_stdout(buf):\n"
                 "    main(['drafters'])\n"
                 "print(sorted(m for m in sys.modules if m.startswith('specdec.drafters')))\n"
                 "print(buf.getvalue())\n")
    loaded, listing = out.split("\n", 1)
    assert set(eval(loaded)) <= BASE_MODULES, loaded
    firsts = {line.split()[0] for line in listing.splitlines() if line.strip()}
    assert {b.usage for b in BUILTINS.values()} <= firsts


def test_import_specdec_loads_no_drafter():
    out = _child("import sys, specdec\n"
                 "print(sorted(m for m in sys.modules if m.startswith('specdec.drafters')))")
    assert set(eval(out)) <= BASE_MODULES, out


def _imports(path):
    """Modules a drafter source file imports, as written (relative ones with their dots)."""
    text = path.read_text()
    if path.suffix == ".py":
        out = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
                out += [mod] if node.module else [mod + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                out += [a.name for a in node.names]
        return out
    out = []
    for m in re.finditer(r"^\s*from\s+(\S+)\s+c?import\s+(.+)$|^\s*c?import\s+(\S+)", text, re.M):
        if m.group(1):
            out += [m.group(1)] if m.group(1).strip(".") else \
                [m.group(1) + n.strip().split()[0] for n in m.group(2).strip("()").split(",")]
        else:
            out.append(m.group(3))
    return out


API_LAYER = {"api", "cli", "models", "benchmark", "testing", "serve", "chat", "engine"}


@pytest.mark.parametrize("path", sorted(p for p in DRAFTERS.iterdir()
                                         if p.suffix in (".py", ".pyx", ".pxd")),
                         ids=lambda p: p.name)
def test_drafter_modules_import_no_api_layer_and_no_registry(path):
    for mod in _imports(path):
        if mod.startswith("..") and not mod.startswith("..."):
            assert mod[2:].split(".")[0] not in API_LAYER, f"{path.name} imports {mod}"
        assert not mod.startswith("specdec."), f"{path.name}: import {mod} relatively"
        if path.name not in ("__init__.py", "registry.py", "guard.py"):
            assert mod != ".registry", f"{path.name} imports the registry (registration by import)"


def test_guarded_override_of_mtp_reads_the_target_rows(bigram_tiny_path):
    """A guarded (deadline) Python override of a built-in keeps what the built-in needs from
    the target: the MTP head's observe gets the batch rows of the hidden states."""
    from specdec.drafters.mtp import MtpDrafter

    class Amended(MtpDrafter):
        def propose(self, seq, last_token, n_max):
            return super().propose(seq, last_token, n_max)

    plain = Decoder(bigram_tiny_path, n_ctx=256).generate([1, 2, 3], max_tokens=24)
    dec = Decoder(bigram_tiny_path, drafter=Amended(), n_max=3, n_ctx=256, drafter_timeout=30.0)
    assert isinstance(dec.drafters[0], GuardedDrafter) and dec.ctx.mtp_hidden == "dense"
    res = dec.generate([1, 2, 3], max_tokens=24)
    assert res.tokens == plain.tokens and res.stats.accepted > 0
