"""Build and run llama.cpp's own reference tools from the pinned source tree.

The benchmarks compare specdec against llama.cpp itself. For that comparison to
be fair, the reference binaries must come from the *same* llama.cpp commit that
specdec links, built with the same CPU flags (native, AMX masked out). This
module builds ``llama-simple``, ``llama-bench`` and ``llama-speculative-simple``
from ``subprojects/llama.cpp`` into a per-user cache directory and wraps each
tool in a small runner that returns parsed numbers instead of raw logs.

The binaries are linked statically (``BUILD_SHARED_LIBS=OFF``), so a cached
binary keeps working whatever happens to the build tree or to other libllama
copies on the machine.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from .. import _build_facts as facts
from .._progress import run_logged
from . import lcp_build

# In a source checkout (editable install) the tools build from the tree specdec itself
# builds, fetched by tools/fetch_llama_cpp.py. An installed package has neither: it
# unpacks llama.cpp from the pinned llama-cpp-python sdist into the cache instead.
REPO_ROOT = Path(__file__).resolve().parents[2]
SRC_DIR = REPO_ROOT / "subprojects" / "llama.cpp"
FETCH_SCRIPT = REPO_ROOT / "tools" / "fetch_llama_cpp.py"
DEFAULT_TOOLS = ("llama-simple", "llama-bench", "llama-speculative-simple")

# AMX masked as in specdec's own build (see _build_facts.AMX_OFF)
AMX_OFF = " ".join(facts.AMX_OFF)

CMAKE_DEFINES: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "OFF",  # self-contained binaries
    "GGML_NATIVE": "ON",
    "CMAKE_C_FLAGS": AMX_OFF,
    "CMAKE_CXX_FLAGS": AMX_OFF,
    # offline: no HTTPS, no web-UI download, no npm (nothing else downloads on Linux CPU)
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    "LLAMA_BUILD_UI": "OFF",
    # only what the three tools need
    "LLAMA_BUILD_COMMON": "ON",
    "LLAMA_BUILD_TOOLS": "ON",  # llama-bench
    "LLAMA_BUILD_EXAMPLES": "ON",  # llama-simple, llama-speculative-simple
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "GGML_CCACHE": "OFF",  # we set the launcher ourselves, see _configure_args
}

STAMP = "stamp.json"

# llama-simple takes its prompt as one argv element; Linux caps a single
# argument at MAX_ARG_STRLEN = 32 pages = 131072 bytes, terminating NUL included.
_MAX_ARG_BYTES = 131071


def _flags_hash() -> str:
    """Hash of everything that changes the produced binaries (flags and chosen compilers)."""
    key = {"defines": CMAKE_DEFINES, "CC": os.environ.get("CC", ""), "CXX": os.environ.get("CXX", "")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def tools_dir() -> Path:
    """Cache dir for the reference tools.

    ``$SPECDEC_LLAMA_TOOLS_DIR`` if set, else
    ``<specdec cache dir>/llama-tools/<pin>-<flags hash>``, so a
    new pin or new flags get a fresh build instead of silently reusing old binaries.
    """
    override = os.environ.get("SPECDEC_LLAMA_TOOLS_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return facts.cache_dir() / "llama-tools" / f"{facts.LLAMA_CPP_PIN}-{_flags_hash()}"


def _source_dir() -> Path:
    """The pinned llama.cpp tree: the checkout's (fetched and sha256-verified by
    tools/fetch_llama_cpp.py if absent), ``$SPECDEC_LLAMA_CPP_DIR``, or, for an
    installed package, the sdist's ``vendor/llama.cpp`` unpacked into the cache."""
    override = os.environ.get("SPECDEC_LLAMA_CPP_DIR")
    if override:
        return Path(override).expanduser().resolve()
    if FETCH_SCRIPT.exists():
        if not (SRC_DIR / "CMakeLists.txt").exists():
            subprocess.run([sys.executable, str(FETCH_SCRIPT), str(SRC_DIR)], check=True)
        return SRC_DIR.resolve()
    return lcp_build.vendored_llama_cpp()


def _read_stamp(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def _write_stamp(root: Path, stamp: dict[str, Any]) -> None:
    tmp = root / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, root / STAMP)  # atomic: a concurrent reader sees old or new, never half


def _stamp_current(stamp: dict[str, Any]) -> bool:
    """Whether a stamp was written for this pin and these flags (the dir may be overridden)."""
    return stamp.get("pin") == facts.LLAMA_CPP_PIN and stamp.get("flags") == _flags_hash()


def _built(root: Path, names: Sequence[str]) -> dict[str, Path] | None:
    """Paths of ``names`` if the stamp says they were built with the current pin and flags."""
    stamp = _read_stamp(root)
    if not _stamp_current(stamp):
        return None
    tools = stamp.get("tools", {})
    out = {}
    for name in names:
        if name not in tools:
            return None
        path = root / tools[name]
        if not os.access(path, os.X_OK):
            return None
        out[name] = path
    return out


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Exclusive lock on the cache dir, so concurrent builds do not run ninja on one tree."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _configure_args(src: Path, build: Path) -> list[str]:
    args = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja"]
    args += [f"-D{k}={v}" for k, v in CMAKE_DEFINES.items()]
    if shutil.which("ccache"):  # speeds rebuilds; does not change the binaries, so not hashed
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return args


def _cached_source(build: Path) -> str | None:
    try:
        text = (build / "CMakeCache.txt").read_text()
    except OSError:
        return None
    m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, re.M)
    return m.group(1) if m else None


def _run_logged(cmd: list[str], out: IO[str] | None, desc: str = "building llama.cpp's tools"
                ) -> None:
    """Run a build step; its output goes to ``out`` (a log file, with a progress bar in a
    terminal) or to our stderr."""
    if out is not None:
        rc = run_logged(cmd, out, desc)
    else:
        # fd 2 rather than sys.stderr: the latter may be a Python object with no fileno (pytest)
        rc = subprocess.run(cmd, stdout=2, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        where = f" (see {out.name})" if out is not None else ""
        raise RuntimeError(f"build step failed with rc={rc}{where}: {' '.join(cmd)}")


def ensure_tools(
    names: Sequence[str] = DEFAULT_TOOLS,
    *,
    jobs: int | None = None,
    log: str | os.PathLike[str] | None = None,
) -> dict[str, Path]:
    """Build the requested llama.cpp tools (once) and return ``{name: binary path}``.

    Returns at once, without locking, when a stamp shows the binaries were built
    with the current pin and flags. Otherwise it takes a file lock on the cache
    dir (concurrent callers wait, then find the stamp), configures with CMake +
    Ninja if needed and builds only the requested targets. No step downloads
    anything; only a missing source tree is fetched, by tools/fetch_llama_cpp.py.

    ``log``: file to append cmake/ninja output to; by default it goes to stderr.
    """
    names = tuple(names)
    root = tools_dir()
    done = _built(root, names)
    if done is not None:
        return done
    with _locked(root):
        done = _built(root, names)  # another process may have built them while we waited
        if done is not None:
            return done
        src = _source_dir()
        build = root / "build"
        stamp = _read_stamp(root)
        if not _stamp_current(stamp):
            stamp = {}  # reconfigure; ninja then rebuilds whatever the new flags or tree touch
        cached = _cached_source(build)
        if cached is not None and Path(cached).resolve() != src:
            shutil.rmtree(build)  # a cache configured for another checkout cannot be reused
            stamp = {}
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(log, "a")) if log is not None else None
            t0 = time.monotonic()
            if not stamp.get("configured") or not (build / "build.ninja").exists():
                _run_logged(_configure_args(src, build), out, "configuring llama.cpp's tools")
                stamp = {"pin": facts.LLAMA_CPP_PIN, "flags": _flags_hash(), "src": str(src),
                         "configured": True, "tools": {}}
                _write_stamp(root, stamp)
            _run_logged(["cmake", "--build", str(build), "-j", str(jobs or os.cpu_count() or 1),
                         "--target", *names], out)
            for name in names:
                binary = build / "bin" / name
                if not os.access(binary, os.X_OK):
                    raise RuntimeError(f"{name}: build finished but {binary} is missing")
                stamp["tools"][name] = str(binary.relative_to(root))
            stamp.setdefault("build_seconds", {})[",".join(names)] = round(time.monotonic() - t0, 1)
            _write_stamp(root, stamp)
    done = _built(root, names)
    assert done is not None
    return done


def _tool(name: str) -> Path:
    return ensure_tools((name,))[name]


def _check(res: subprocess.CompletedProcess[bytes], cmd: Sequence[str]) -> None:
    if res.returncode != 0:
        tail = res.stderr.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{Path(cmd[0]).name} failed with rc={res.returncode}:\n{tail}")


def _after_prompt(out: str, prompt: str, tool: str) -> str:
    """Text after the echoed prompt.

    Both tools echo the prompt as the concatenated pieces of its tokens, rendered
    with ``special=true``: for Gemma that is ``"<bos>" + prompt`` (an SPM vocab
    with a space prefix would echo ``"<s> " + prompt``). The echo is therefore
    the prompt behind a short special-token prefix; we look for it there only.
    """
    i = out.find(prompt)
    if not prompt or i < 0 or i > 64:
        raise RuntimeError(
            f"{tool}: could not find the prompt echo in its output; the prompt does not "
            f"round-trip through the tokenizer (output starts {out[:120]!r})")
    return out[i + len(prompt):]


def run_simple(
    model: str | os.PathLike[str],
    prompt: str,
    n_predict: int,
    *,
    threads: int = 2,
    extra: Sequence[str] = (),
) -> str:
    """Greedy continuation of ``prompt`` by ``llama-simple``; returns only the generated text.

    What llama-simple (examples/simple/simple.cpp at the pin) does, so that our
    side can reproduce it exactly:

    * Tokenization: ``llama_tokenize(vocab, prompt, add_special=true,
      parse_special=true)``, i.e. BOS is added when the vocab asks for it, and
      special-token text in the prompt (``<start_of_turn>``...) becomes the
      special token.
    * Context: ``llama_context_default_params()`` with ``n_ctx = n_prompt +
      n_predict - 1`` (libllama pads it up to a multiple of 256), ``n_batch =
      n_prompt`` (the whole prompt is one ``llama_decode``), ``n_ubatch =
      min(n_prompt, 512)`` (default 512, clamped to n_batch), n_seq_max 1,
      KV cache F16 with ``swa_full=true``, flash attention AUTO (resolves to
      on: the graph uses FLASH_ATTN_EXT on CPU), ``no_perf=false``. Model params
      are the defaults (mmap, extra buffer types on, so Q4_K weights are
      repacked to q4_K_8x8) with ``n_gpu_layers = 99`` (moot on a CPU build).
      E.g. a 602-token prompt with n_predict 64 logged n_ctx 768, n_batch 602,
      n_ubatch 512.
    * Threads: llama-simple has no ``-t``; it keeps the default ``n_threads =
      n_threads_batch = GGML_DEFAULT_N_THREADS = 4``. ggml runs its graph in an
      OpenMP ``parallel num_threads(n)`` region and then uses however many
      threads it actually got, so we cap it with ``OMP_THREAD_LIMIT=threads``.
    * Sampler: a chain holding only ``llama_sampler_init_greedy()`` (argmax, no
      penalties, no top-k/p, no temperature).
    * Output: stdout gets the prompt's token pieces, then each generated piece
      (``llama_token_to_piece(..., lstrip=0, special=true)``), then one ``"\\n"``.
      Generation stops after exactly ``n_predict`` tokens, or earlier at an EOG
      token, which is not printed. Timings go to stderr.
    * Arguments: the prompt is every argument after ``-m/-n/-ngl``, joined by
      spaces. We pass it as *one* argv element, so newlines and runs of spaces
      survive intact; but a lone ``-m``/``-n``/``-ngl`` would be parsed as a
      flag, and Linux limits one argument to 128 KiB. The tool has no prompt-file
      option, so both cases are rejected here rather than silently mangled.

    ``extra`` goes before the prompt (only ``-ngl N`` means anything to it).
    """
    raw = prompt.encode()
    if not prompt or prompt in ("-m", "-n", "-ngl") or "\0" in prompt:
        raise ValueError("llama-simple cannot take this prompt on its command line")
    if len(raw) > _MAX_ARG_BYTES:
        raise ValueError(f"prompt is {len(raw)} bytes; llama-simple takes it as one argv "
                         f"element, which Linux caps at {_MAX_ARG_BYTES} bytes")
    cmd = [str(_tool("llama-simple")), "-m", str(model), "-n", str(n_predict), *extra, prompt]
    env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
    res = subprocess.run(cmd, capture_output=True, env=env)
    _check(res, cmd)
    out = res.stdout.decode(errors="replace")
    out = out[:-1] if out.endswith("\n") else out  # the final printf("\n")
    return _after_prompt(out, prompt, "llama-simple")


def run_bench(model: str | os.PathLike[str], *, n_gen: int = 128, threads: int = 2,
              reps: int = 3) -> dict[str, Any]:
    """Plain decode speed from ``llama-bench -p 0 -n n_gen -t threads -r reps -o json``.

    llama-bench runs one warm-up, then ``reps`` timed generations of ``n_gen``
    tokens from an empty context, one token per decode. Returns ``tok_s_mean``
    and ``tok_s_std`` (llama-bench's own avg_ts / stddev_ts over the reps),
    plus the raw per-rep ``samples_ts``.
    """
    cmd = [str(_tool("llama-bench")), "-m", str(model), "-p", "0", "-n", str(n_gen),
           "-t", str(threads), "-r", str(reps), "-o", "json"]
    res = subprocess.run(cmd, capture_output=True)
    _check(res, cmd)
    rows = json.loads(res.stdout)
    row = next(r for r in rows if r["n_prompt"] == 0 and r["n_gen"] == n_gen)
    return {
        "tok_s_mean": float(row["avg_ts"]),
        "tok_s_std": float(row["stddev_ts"]),
        "samples_ts": [float(x) for x in row["samples_ts"]],
        "n_gen": n_gen, "threads": int(row["n_threads"]), "reps": reps,
        "model_type": row.get("model_type"), "build_commit": row.get("build_commit"),
    }


# Which option sets the draft length for each --spec-type. For the n-gram types
# --spec-draft-n-max is *not* the draft length (it only feeds the "n_draft ="
# line of the summary): ngram-simple drafts its size-m tokens, for example.
_DRAFT_LEN_FLAG = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}

_RE_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_RE_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def _flag_value(args: Sequence[str], flag: str, default: int) -> int:
    """Last value given for ``flag`` in ``args`` (llama.cpp's parser keeps the last one)."""
    value = default
    for i, a in enumerate(args[:-1]):
        if a == flag:
            value = int(args[i + 1])
    return value


def _stat(text: str, key: str) -> int:
    # lines carry common_log's "M.SS.mmm.uuu I " prefix on stderr, so no ^ anchor
    m = re.search(rf"\b{key}\s*=\s*(\d+)\s*$", text, re.M)
    if m is None:
        raise RuntimeError(f"llama-speculative-simple: no '{key} =' line in its summary")
    return int(m.group(1))


_RE_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)")
_RE_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def parse_drafts(log: str) -> list[tuple[list[int], int]]:
    """The rounds in a ``-v`` log of llama-speculative-simple: ``(draft tokens, accepted)``
    per round, in order (``([], 0)`` for a round without a draft).

    Each draft step logs its top candidates (``draft candidate 0`` is the token drafted at
    that position); each verification logs ``accepted A/K draft tokens``.
    """
    rounds: list[tuple[list[int], int]] = []
    cur: list[int] = []
    for line in log.splitlines():
        m = _RE_CANDIDATE.search(line)
        if m:
            if int(m.group(1)) == 0:
                cur = []
            cur.append(int(m.group(2)))
            continue
        m = _RE_ACCEPTED.search(line)
        if m:
            a, k = int(m.group(1)), int(m.group(2))
            rounds.append((cur[:k], a))
            cur = []
    return rounds


#: extra runs of a reference tool whose log lost its tail (see run_spec_simple)
_LOST_LOG_RETRIES = 3


def run_spec_simple(
    model: str | os.PathLike[str],
    prompt: str,
    n_predict: int,
    *,
    spec_type: str,
    n_max: int,
    threads: int = 2,
    extra: Sequence[str] = (),
    drafts: bool = False,
    echo: str | None = None,
) -> dict[str, Any]:
    """Greedy speculative generation by ``llama-speculative-simple``.

    The prompt goes through ``-f FILE`` (any length, any bytes; the tool drops
    one trailing newline from the file, so we write one extra). It is tokenized
    with add_special and parse_special true, like llama-simple. Sampling is
    ``--temp 0`` (greedy). ``n_max`` is the draft length: ``--spec-draft-n-max``
    for the draft-model types, and the type's own size option for the n-gram
    types (see ``_DRAFT_LEN_FLAG``); other n-gram knobs go in ``extra``.
    ngram-simple matches a key of ``--spec-ngram-simple-size-n`` tokens (default
    12) and drafts nothing at all when the draft length is shorter than the key,
    so a short ``n_max`` needs a short key too (the anchors used key 3, draft 3);
    we raise rather than silently measure a plain decode. ``spec_type="none"``
    is refused by the tool itself ("failed to initialize speculative decoding").

    Length: the tool stops only once it has produced *more* than ``-n``
    tokens, so we pass ``n_predict - 1``. It trims each draft to the remaining
    budget, except when that budget is 0 (``dp.n_max > 0`` guards the trim), so
    the last step may still add up to a whole draft: expect ``n_predict`` to
    ``n_predict + n_max`` tokens, and compare texts on their common prefix.
    The count actually produced is returned as ``n_predict``. Its context is the model's training length (``-c 0``) and
    its batch 2048 unless ``extra`` says otherwise; the prompt must fit in one batch.

    Returns ``text`` (generation only), ``tok_s`` (its "decoded ... t/s": the
    accepted tokens over the decode loop's wall time, which starts after the
    prompt minus its last token was evaluated), ``n_predict`` (tokens produced),
    ``decode_s``, ``n_prompt``, ``prompt_tok_s``, ``n_drafted`` and
    ``n_accepted`` (drafts counted only when their verification is committed).
    ``echo`` is the prompt as the tool prints it back, when the vocabulary does not
    round-trip text (e.g. the test vocab, which detokenizes to hex).
    With ``drafts=True`` the tool runs verbose and ``drafts`` lists every verified
    draft with its accepted count (``parse_drafts``); its timings are then not comparable.
    """
    if n_predict < 1:
        raise ValueError("n_predict must be >= 1")
    if "ngram-simple" in spec_type.split(","):
        size_n = _flag_value(extra, "--spec-ngram-simple-size-n", 12)
        if n_max < size_n:  # common_ngram_simple_draft returns nothing when size_m < size_n
            raise ValueError(f"ngram-simple never drafts when its draft length (n_max={n_max}) is "
                             f"below its key length (size-n={size_n}); pass "
                             f"extra=('--spec-ngram-simple-size-n', 'K') with K <= n_max")
    cmd = [str(_tool("llama-speculative-simple")), "-m", str(model), "-n", str(n_predict - 1),
           "-t", str(threads), "--temp", "0", "--log-colors", "off",
           "--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]
    for t in spec_type.split(","):
        if t in _DRAFT_LEN_FLAG:
            cmd += [_DRAFT_LEN_FLAG[t], str(n_max)]
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(prompt.encode() + b"\n")
        f.flush()
        cmd += ["-f", f.name, *extra] + (["-v"] if drafts else [])
        # llama.cpp's logger writes from a thread and is never flushed at exit (common/log.cpp
        # leaks it on purpose), so a run can lose the tail of its log, timing summary included:
        # seen with -v in about 1 of 20 runs. The log is in order, so a run whose summary
        # arrived lost nothing before it; a run without one is run again.
        for attempt in range(_LOST_LOG_RETRIES + 1):
            res = subprocess.run(cmd, capture_output=True)
            _check(res, cmd)
            err = res.stderr.decode(errors="replace")
            dec, enc = _RE_DECODED.search(err), _RE_ENCODED.search(err)
            if dec is not None and enc is not None:
                break
        else:
            raise RuntimeError(f"llama-speculative-simple: no timing summary in "
                               f"{_LOST_LOG_RETRIES + 1} runs; the last ended:\n{err[-3000:]}")
    out = res.stdout.decode(errors="replace")
    # stdout is "\n\n" + prompt echo + generation + "\n\n" + "\n\n" (two LOG("\n\n") at the end)
    out = out[:-4] if out.endswith("\n\n\n\n") else out
    return {
        "text": _after_prompt(out, prompt if echo is None else echo, "llama-speculative-simple"),
        "tok_s": float(dec.group(3)),
        "n_predict": int(dec.group(1)),
        "decode_s": float(dec.group(2)),
        "n_prompt": int(enc.group(1)),
        "prompt_tok_s": float(enc.group(3)),
        "n_drafted": _stat(err, "n_drafted"),
        "n_accepted": _stat(err, "n_accept"),
        **({"drafts": parse_drafts(err)} if drafts else {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specdec.benchmark.llama_tools",
                                 description="Build llama.cpp's reference tools from the pinned tree.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tools (once) and print their paths")
    b.add_argument("names", nargs="*", default=list(DEFAULT_TOOLS))
    b.add_argument("-j", "--jobs", type=int, default=None)
    b.add_argument("--log", default=None, help="append build output to this file")
    sub.add_parser("dir", help="print the cache directory")
    args = ap.parse_args(argv)
    if args.cmd == "dir":
        print(tools_dir())
        return 0
    for name, path in ensure_tools(args.names, jobs=args.jobs, log=args.log).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
