"""The specdec cache directory: where it is, what is in it, and how big it may grow.

Every part of specdec that writes to the cache (the default model, layer-skip and
MTP-head derivations, the benchmark's peer builds, ``tools/fetch_llama_cpp.py``)
asks :func:`cache_dir` (whose rule lives in ``_build_facts``, shared with the build
script), so ``$SPECDEC_CACHE_DIR`` moves all of it.

Files derived from a model are keyed by the model's *content* (a hash of its GGUF
header, metadata and tensor infos), so moving or touching the model reuses them, and
each is written with a ``.json`` sidecar saying what it was derived from. With
``$SPECDEC_CACHE_MAX_SIZE`` (``"2G"``, ``"500M"``, bytes) the derived files are
evicted least-recently-used first whenever a new one is written; the peers' builds
and the llama.cpp sources are listed and removable, never evicted on their own.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from ._build_facts import cache_dir

#: sub-directories holding files specdec derives at runtime (the size cap applies to these)
DERIVED = ("models", "layerskip", "mtp-head")
SIDECAR = ".json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: Union[str, int]) -> int:
    """``"2G"``, ``"500M"``, ``"1.5GB"`` or a byte count, as bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 2G or a byte count)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))


def max_size() -> Optional[int]:
    """The cap on derived files from ``$SPECDEC_CACHE_MAX_SIZE``, or None for no cap."""
    env = os.environ.get("SPECDEC_CACHE_MAX_SIZE")
    return parse_size(env) if env else None


def content_key(path: Union[str, "os.PathLike[str]"], *params: Any) -> str:
    """A hex key for ``path``'s GGUF content (header, metadata, tensor infos) and ``params``.

    The tensor infos carry every tensor's name, type, shape and offset, so two files
    differ here unless they are the same model; the path and mtime play no part.
    """
    from ._gguf_layout import parse_gguf

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        lay = parse_gguf(mm, strings=False)
        h = hashlib.sha256(mm[:lay.data_start])
        del lay
    h.update(json.dumps([str(p) for p in params]).encode())
    return h.hexdigest()[:16]


def derived_path(kind: str, stem: str, key: str, suffix: str = ".gguf") -> Path:
    """Where a file of ``kind`` (a :data:`DERIVED` sub-directory) keyed by ``key`` lives."""
    return cache_dir() / kind / f"{stem}-{key}{suffix}"


def lookup(path: Path) -> Optional[Path]:
    """``path`` if it is cached (its last use is recorded for the size cap), else None."""
    if not path.exists():
        return None
    try:
        os.utime(path.with_name(path.name + SIDECAR))
    except OSError:
        pass
    return path


def publish(tmp: Path, out: Path, *, source: Union[str, "os.PathLike[str]", None],
            **info: Any) -> Path:
    """Move a finished ``tmp`` to ``out`` with a sidecar recording its origin, then
    apply the size cap (never evicting ``out`` itself)."""
    meta = {"source": str(Path(source).resolve()) if source is not None else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info}
    side = out.with_name(out.name + SIDECAR)
    side_tmp = side.with_name(side.name + f".tmp{os.getpid()}")
    side_tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, out)
    os.replace(side_tmp, side)
    cap = max_size()
    if cap is not None:
        enforce_cap(cap, keep=out)
    return out


@dataclass(frozen=True)
class Entry:
    """One thing in the cache: a derived file (with its sidecar) or a build/source tree."""

    name: str                 # path relative to the cache dir
    path: Path
    size: int                 # bytes, sidecar and directory contents included
    last_used: float
    derived: bool             # under a DERIVED directory: subject to the size cap
    info: Dict[str, Any]      # the sidecar's fields (source, created, kind...), if any

    @property
    def source(self) -> str:
        src = self.info.get("source")
        if src:
            return str(src)
        return "" if self.derived else "build / download"


def _tree_size(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def entries(root: Optional[Path] = None) -> List[Entry]:
    """Everything in the cache dir, one entry per derived file or per top-level item of
    the other sub-directories (a peer build, an sdist, an unpacked source)."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    out: List[Entry] = []
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or sub.name.startswith("."):
            out.append(Entry(sub.name, sub, _tree_size(sub), sub.lstat().st_mtime, False, {}))
            continue
        for item in sorted(sub.iterdir()):
            if item.name.endswith(SIDECAR) and item.with_name(item.name[:-len(SIDECAR)]).exists():
                continue
            if item.suffix.startswith(".tmp"):   # a write in progress, or one a crash left
                out.append(Entry(f"{sub.name}/{item.name}", item, _tree_size(item),
                                 item.lstat().st_mtime, False, {"source": "unfinished write"}))
                continue
            side = item.with_name(item.name + SIDECAR)
            info: Dict[str, Any] = {}
            used = item.lstat().st_mtime
            size = _tree_size(item)
            if side.exists():
                try:
                    info = json.loads(side.read_text())
                except (OSError, ValueError):
                    info = {}
                used = max(used, side.stat().st_mtime)
                size += side.stat().st_size
            out.append(Entry(f"{sub.name}/{item.name}", item, size, used, sub.name in DERIVED, info))
    return out


def remove(entry: Entry) -> int:
    """Delete one entry (and its sidecar); returns the bytes freed."""
    if entry.path.is_dir() and not entry.path.is_symlink():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink(missing_ok=True)
    entry.path.with_name(entry.path.name + SIDECAR).unlink(missing_ok=True)
    return entry.size


def select(names: List[str], root: Optional[Path] = None) -> List[Entry]:
    """Entries named exactly (``layerskip/x.gguf``) or by a whole sub-directory (``layerskip``)."""
    all_ = entries(root)
    chosen: List[Entry] = []
    for n in names:
        n = n.strip("/")
        hit = [e for e in all_ if e.name == n or e.name.startswith(n + "/")]
        if not hit:
            raise ValueError(f"nothing named {n!r} in the cache ({cache_dir() if root is None else root}); "
                             "`specdec cache` lists what is there")
        chosen += [e for e in hit if e not in chosen]
    return chosen


def enforce_cap(cap: int, keep: Optional[Path] = None, root: Optional[Path] = None) -> List[Entry]:
    """Evict derived files, least recently used first, until they total at most ``cap``
    bytes; returns what was removed."""
    derived = sorted((e for e in entries(root) if e.derived), key=lambda e: e.last_used)
    total = sum(e.size for e in derived)
    gone: List[Entry] = []
    for e in derived:
        if total <= cap:
            break
        if keep is not None and e.path == keep:
            continue
        total -= remove(e)
        gone.append(e)
    return gone


def human(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"


def iter_table(items: List[Entry]) -> Iterator[str]:
    """Lines of a listing: size, last use, name, and what it was derived from."""
    for e in items:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        parts = [e.source] if e.source else []
        parts += [f"{k}={v}" for k, v in e.info.items() if k not in ("source", "created", "sha256")]
        yield f"{human(e.size):>8s}  {used}  {e.name}" + (f"  <- {', '.join(parts)}" if parts else "")
