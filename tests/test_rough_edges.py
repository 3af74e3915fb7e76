"""What a new user trips over first: each rough edge has a clear error or a documented behaviour."""
import importlib
import logging
import os
import subprocess
import time
import sys
import tempfile

import pytest

import specdec
from specdec.drafters import Drafter, available, create, describe, register


def _cli(*args, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                          input=stdin, timeout=300, cwd=tempfile.gettempdir(),
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("spec,match", [
    ("ngram:x", r"bad drafter 'ngram:x' \(usage: ngram\[:N\]\): invalid literal"),
    ("draft", r"drafter 'draft' needs an argument: draft:PATH"),
    ("layerskip", r"drafter 'layerskip' needs an argument: layerskip:N"),
    ("ngram-map:zz", r"bad drafter 'ngram-map:zz' \(usage: ngram-map\[:N\]\)"),
])
def test_bad_drafter_argument_is_a_clear_error(spec, match):
    with pytest.raises(ValueError, match=match):
        create(spec)


def test_drafter_class_instead_of_instance(tiny_dense_path):
    with pytest.raises(TypeError, match=r"drafter=Drafter is a class: pass an instance"):
        create(specdec.Drafter)

    class Repeat(Drafter):
        def propose(self, seq, last_token, n_max):
            return [last_token] * n_max

    d = create(Repeat)                       # a subclass is instantiated
    assert isinstance(d, Repeat)
    dec = specdec.Decoder(tiny_dense_path, drafter=Repeat, n_max=2, n_ctx=256)
    assert dec.generate("tok_1", max_tokens=6).stats.n_generated == 6


def _plugin(tmp_path, monkeypatch, name):
    site = tmp_path / "site"
    (site / "shadow_plugin").mkdir(parents=True)
    (site / "shadow_plugin" / "__init__.py").write_text(
        "from specdec.drafters import Drafter\n"
        "class Shadow(Drafter):\n"
        "    '''A plugin named like a built-in.'''\n"
        "    def propose(self, seq, last_token, n_max):\n"
        "        return []\n")
    dist = site / "shadow_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[specdec.drafters]\n{name} = shadow_plugin:Shadow\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


def test_plugin_shadowing_a_builtin_warns_and_the_builtin_wins(tmp_path, monkeypatch, caplog):
    from specdec.drafters import registry
    _plugin(tmp_path, monkeypatch, "suffix")
    monkeypatch.setattr(registry, "_warned_shadow", set())
    monkeypatch.delenv("SPECDEC_DRAFTER_OVERRIDE", raising=False)
    with caplog.at_level(logging.WARNING, logger="specdec.drafters"):
        assert type(create("suffix")).__name__ == "SuffixDrafter"
        assert available()["suffix"] == "specdec.drafters.suffix"
        create("suffix")
    warned = [r.getMessage() for r in caplog.records if "shadow_plugin:Shadow" in r.getMessage()]
    assert len(warned) == 1 and "SPECDEC_DRAFTER_OVERRIDE=suffix" in warned[0]
    # the user opts in: the plugin replaces the built-in
    monkeypatch.setenv("SPECDEC_DRAFTER_OVERRIDE", "suffix")
    monkeypatch.setattr(registry, "_registry", {})
    monkeypatch.setattr(registry, "_sources", {})
    monkeypatch.setattr(registry, "_replaced", set())
    assert type(create("suffix")).__name__ == "Shadow"
    assert describe("suffix") == ("suffix", "A plugin named like a built-in.")


def test_register_over_a_builtin_needs_replace():
    class Mine(Drafter):
        def propose(self, seq, last_token, n_max):
            return []

    with pytest.raises(ValueError, match="'ngram' is a built-in drafter; pick another name"):
        register("ngram")(Mine)


def test_cli_drafters_shows_usage_and_summary():
    p = _cli("drafters")
    assert p.returncode == 0, p.stderr
    lines = {line.split()[0]: line for line in p.stdout.splitlines()}
    assert set(lines) >= {"ngram[:N]", "draft:PATH", "layerskip:N", "suffix[:DEPTH]",
                          "ngram-map[:N]", "ngram-cache[:STATIC_PATH]"}
    assert "prompt lookup" in lines["ngram[:N]"] and "smaller GGUF" in lines["draft:PATH"]


@pytest.mark.parametrize("cmd", [[], ["generate"], ["drafters"], ["cache"], ["bench"]])
def test_cli_help_is_plain_text(cmd):
    p = _cli(*cmd, "--help")
    assert p.returncode == 0 and "usage: specdec" in p.stdout
    assert "``" not in p.stdout and ":class:" not in p.stdout and ":func:" not in p.stdout


def test_cli_version():
    p = _cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"specdec {specdec.__version__}"


def test_cli_prompt_from_stdin(tiny_dense_path):
    p = _cli("generate", "-m", tiny_dense_path, "-f", "-", "-n", "3", "--json", stdin="tok_5 tok_6")
    assert p.returncode == 0, p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["stats"]["n_generated"] == 3 and out["stats"]["n_prompt"] > 1


def test_builtin_drafter_classes_exported_lazily():
    code = ("import sys, specdec, specdec.drafters as d\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('specdec.drafters.')\n"
            "                and m.split('.')[-1] not in ('_base', '_run', 'registry', 'guard'))\n"
            "assert loaded == [], loaded\n"
            "from specdec.drafters import NgramDrafter, SuffixDrafter, MtpDrafter, DraftModelDrafter\n"
            "from specdec.drafters import NgramMapDrafter, NgramMapK4VDrafter, NgramCacheDrafter\n"
            "from specdec.drafters import LayerSkipDrafter\n"
            "assert issubclass(NgramDrafter, d.Drafter) and 'NgramDrafter' in d.__all__\n"
            "assert 'SuffixDrafter' in dir(d)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tempfile.gettempdir())
    assert p.returncode == 0, p.stderr
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        specdec.drafters.Nope


def test_decoder_close_and_context_manager(tiny_dense_path):
    with specdec.Decoder(tiny_dense_path, drafter="ngram", n_ctx=256) as dec:
        assert dec.generate([1, 2, 3], max_tokens=3).stats.n_generated == 3
    with pytest.raises(RuntimeError, match="this Decoder is closed"):
        dec.generate([1, 2, 3], max_tokens=3)
    dec.close()                                   # twice is harmless
    d2 = specdec.Decoder(tiny_dense_path, n_ctx=256)
    d2.close()
    with pytest.raises(RuntimeError, match="closed"):
        d2.stream([1], max_tokens=2)


def test_help_decoder_documents_every_parameter():
    import inspect
    doc = inspect.getdoc(specdec.Decoder)
    for name in inspect.signature(specdec.Decoder).parameters:
        assert name in doc, f"Decoder's docstring does not document {name}"
    assert "._" not in doc                        # no pointers at private methods
    assert "close()" in doc and "with Decoder" in doc


class _Slow(Drafter):
    """Drafts tokens the target never takes (its own continuation, off by one), slowly."""

    def __init__(self, truth, n_prompt):
        super().__init__()
        self.truth, self.n_prompt = truth, n_prompt

    def propose(self, seq, last_token, n_max):
        time.sleep(0.002)
        done = len(self.history(seq)) - self.n_prompt + 1
        return [(t + 1) % 100 for t in self.truth[done:done + n_max]]


class _Oracle(Drafter):
    def __init__(self, truth, n_prompt):
        super().__init__("oracle")
        self.truth, self.n_prompt = truth, n_prompt

    def propose(self, seq, last_token, n_max):
        done = len(self.history(seq)) - self.n_prompt + 1
        return list(self.truth[done:done + n_max])


def _judged(caplog):
    return [r for r in caplog.records if "cost more than it gained" in r.getMessage()]


def test_a_fixed_drafter_that_does_not_pay_gets_one_warning(tiny_dense_path, caplog):
    plain = specdec.Decoder(tiny_dense_path, n_ctx=512).generate([1, 2, 3], max_tokens=60)
    dec = specdec.Decoder(tiny_dense_path, drafter=_Slow(plain.tokens, 3), n_max=3, n_ctx=512)
    with caplog.at_level(logging.WARNING, logger="specdec"):
        dec.generate([1, 2, 3], max_tokens=10)           # too few rounds to judge
        assert not _judged(caplog)
        for _ in range(3):
            assert dec.generate([1, 2, 3], max_tokens=40).stats.accepted == 0
    (rec,) = _judged(caplog)
    assert "adaptive=True" in rec.getMessage() and "_Slow" in rec.getMessage()


def test_no_warning_for_a_paying_or_adaptive_drafter(tiny_dense_path, caplog):
    plain = specdec.Decoder(tiny_dense_path, n_ctx=512).generate([1, 2, 3], max_tokens=100)
    good = specdec.Decoder(tiny_dense_path, drafter=_Oracle(plain.tokens, 3), n_max=3, n_ctx=512)
    adaptive = specdec.Decoder(tiny_dense_path, drafter=_Slow(plain.tokens, 3), n_max=3, n_ctx=512,
                               adaptive=True)
    with caplog.at_level(logging.WARNING, logger="specdec"):
        r = good.generate([1, 2, 3], max_tokens=100)
        adaptive.generate([1, 2, 3], max_tokens=100)
    assert r.stats.draft_rounds >= 16 and r.stats.accepted > 0
    assert not _judged(caplog)


PUBLIC_CLASSES = ["Model", "Batch", "Context", "Drafter", "NgramDrafter", "NgramMapDrafter",
                  "NgramMapK4VDrafter", "NgramCacheDrafter", "SuffixDrafter", "DraftModelDrafter",
                  "MtpDrafter"]


def _source_init(cls):
    """The parameters of ``cls.__init__`` as written in its .pyx (None without the sources)."""
    import re
    from pathlib import Path
    mod = sys.modules[cls.__module__]
    src = Path(mod.__file__).with_name(cls.__module__.rsplit(".", 1)[-1] + ".pyx")
    if not src.exists():
        return None
    text = src.read_text()
    start = re.search(rf"^cdef class {cls.__name__}\b", text, re.M).end()
    i = text.index("    def __init__(", start) + len("    def __init__(")
    names = []
    for p in " ".join(text[i:text.index("):", i)].split()).split(","):
        p = p.strip().partition("=")[0].replace(" not None", "").split()
        if p and p[-1] != "self" and not p[-1].startswith("_"):
            names.append(p[-1])
    return names


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_cython_classes_carry_signatures(name):
    import inspect
    cls = getattr(specdec, name, None) or getattr(specdec.drafters, name)
    sig = inspect.signature(cls)
    got = [(p.name, p.kind == p.KEYWORD_ONLY) for p in sig.parameters.values()]
    src = _source_init(cls)
    if src is not None:          # the docstring's signature is the one __init__ has
        want = [(n, "*" in src[:i]) for i, n in enumerate(src) if n != "*"]
        assert got == want, (got, want)
    assert "--" not in (cls.__doc__ or "").splitlines()[:1]
    # methods are introspectable too
    if name == "Model":
        assert list(inspect.signature(cls.tokenize).parameters)[:2] == ["self", "text"]


def test_llama_load_chatter_is_debug(tiny_dense_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="specdec.llama"):
        specdec.Model(tiny_dense_path)
    levels = [r.levelno for r in caplog.records if r.name == "specdec.llama"]
    assert levels.count(logging.DEBUG) > 20            # llama.cpp's load messages ...
    assert logging.INFO not in levels                  # ... none at INFO


def test_progress_bars_quiet_off_a_terminal(tmp_path):
    """The default model is assembled with a bar on a terminal only (here stderr is a pipe)."""
    code = ("import specdec, sys; p = specdec.default_model_path(); "
            "assert p.exists() and p.stat().st_size > 200e6, p; "
            "from specdec._progress import shown; print(shown())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       cwd=tempfile.gettempdir(), env={**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False" and p.stderr == ""
    assert (tmp_path / "models" / "gemma3-270m-q4_k_m.gguf.json").exists()


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_bar_on_a_terminal(tmp_path, quiet):
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a real size
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path)}
    if quiet:
        env["SPECDEC_QUIET"] = "1"
    p = subprocess.Popen([sys.executable, "-c", "import specdec; specdec.default_model_path()"],
                         stdout=subprocess.DEVNULL, stderr=slave, cwd=tempfile.gettempdir(), env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=600) == 0
    os.close(master)
    assert (b"assembling the default model" in out) != quiet, out[-500:]
