"""The package's layout holds: the runtime never needs the tooling (``specdec.benchmark``,
``specdec.testing``), and every source file is installed by a meson.build."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "specdec"
TOOLING = ("specdec.benchmark", "specdec.testing")
#: the one runtime module allowed to import tooling, and what: the CLI hands `specdec bench` over
ALLOWED = {"specdec.cli": "specdec.benchmark.cli"}

needs_source = pytest.mark.skipif(not (SRC / "meson.build").exists(),
                                  reason="needs the source tree next to the tests")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth of its code."""
    name = _module_name(path)
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    text = path.read_text()
    if path.suffix == ".pyx":   # Cython: its Python imports, read line by line
        out = set()
        for m in re.finditer(r"^\s*(?:from\s+(\.*)([\w.]*)\s+import\s+([\w, ]+)|import\s+([\w.]+))",
                             text, re.M):
            dots, mod, names, plain = m.groups()
            text_ = f"from {dots}{mod} import {names}" if plain is None else f"import {plain}"
            out |= _imports_of(ast.parse(text_), package)
        return out
    return _imports_of(ast.parse(text, str(path)), package)


def _imports_of(tree: ast.AST, package: str) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = node.module or ""
            full = (f"{base}.{mod}" if mod else base) if node.level else mod
            out.add(full)
            out.update(f"{full}.{a.name}" for a in node.names)
    return out


def _runtime_sources() -> list[Path]:
    files = [p for p in SRC.rglob("*") if p.suffix in (".py", ".pyx")]
    return [p for p in files if not _module_name(p).startswith(TOOLING)]


@needs_source
def test_runtime_modules_import_no_tooling():
    bad = []
    for path in _runtime_sources():
        mod = _module_name(path)
        for imp in _imports(path):
            allowed = ALLOWED.get(mod)
            if imp.startswith(TOOLING) and not (allowed and imp.startswith(allowed)):
                bad.append(f"{mod} imports {imp}")
    assert not bad, bad


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())


def test_import_specdec_loads_no_tooling():
    p = _child("import sys, specdec\n"
               "print(sorted(m for m in sys.modules if m.startswith('specdec')))")
    assert p.returncode == 0, p.stderr
    loaded = eval(p.stdout)
    assert "specdec.api" in loaded
    assert not [m for m in loaded if m.startswith(TOOLING)], loaded


# a finder that makes the tooling packages and the optional extras absent, as in a plain
# `pip install specdec` without them
_BLOCK = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("specdec.benchmark", "specdec.testing", "starlette", "uvicorn",
                            "prometheus_client", "jinja2", "matplotlib", "llguidance")):
            raise ImportError(f"{name} is not installed")
sys.meta_path.insert(0, Absent())
"""


def test_runtime_works_without_tooling_or_extras(tiny_dense_path):
    code = _BLOCK + f"""
import specdec, specdec.cli
for drafter in ("ngram", "suffix"):
    r = specdec.Decoder({tiny_dense_path!r}, drafter=drafter, n_max=3, n_ctx=128).generate(
        [1, 2, 3, 1, 2, 3], max_tokens=8)
    assert len(r.tokens) == 8, r.tokens
assert specdec.cli.main(["cache", "list"]) == 0
try:
    specdec.Decoder({tiny_dense_path!r}, n_ctx=128).generate([1, 2], max_tokens=2, regex="a")
except ImportError as e:
    print("structured:", e)
try:
    specdec.cli.main(["bench", "--help"])
except ImportError as e:
    print("bench:", e)
"""
    p = _child(code)
    assert p.returncode == 0, p.stderr
    assert "bench: specdec.benchmark" in p.stdout      # only `specdec bench` needs the tooling
    assert "structured: constrained output" in p.stdout and "specdec[structured]" in p.stdout


def _installed_names(meson: Path) -> set[str]:
    """The quoted file names in a meson.build (its install_sources and extension modules)."""
    return set(meson.read_text().split("'")[1::2])


@needs_source
def test_every_source_file_is_installed():
    """A file missing from its meson.build is absent from the wheel, though an editable
    install (which reads the tree) still finds it: only a clean install would show it."""
    listed: dict[Path, set[str]] = {}
    for meson in SRC.rglob("meson.build"):
        listed[meson.parent] = _installed_names(meson)
    missing = []
    for path in SRC.rglob("*"):
        if path.suffix not in (".py", ".pyi", ".pyx", ".pxd", ".h", ".txt", ".typed") \
                or "__pycache__" in path.parts:
            continue
        d = path.parent
        while d not in listed:     # the nearest meson.build above the file lists it
            d = d.parent
        rel = path.relative_to(d).as_posix()
        extension = path.suffix == ".pyx" and path.stem in listed[d]   # foreach m: m + '.pyx'
        if rel not in listed[d] and not extension:
            missing.append(str(path.relative_to(SRC.parent)))
    assert not missing, missing


#: the most lines a source file may have: one concept per file
MAX_LINES = 600
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".pxi", ".pyi", ".h")


@needs_source
def test_no_source_file_over_600_lines():
    """No source file of the package, its tests or its benchmarks is over ``MAX_LINES``. A
    Cython class that would be longer keeps its methods and moves their work into free
    functions beside it (``_context.pxi`` and the ``_context_*.pxi`` it delegates to)."""
    root = SRC.parent
    long = []
    for top in (SRC, root / "tests", root / "bench"):
        for path in top.rglob("*"):
            if path.suffix not in SOURCE_SUFFIXES or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                long.append(f"{rel}: {n} lines")
    assert not long, long
