"""Run llama.cpp's reference tools on a model and prompt; return parsed numbers and text.

Each runner documents what the tool does at the pin, so that specdec's side of a
comparison can reproduce it exactly.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .build import tool
from .parse import (RE_DECODED, RE_ENCODED, RE_EVAL, after_prompt, flag_value, parse_drafts, stat,
                    summary_complete)

# llama-simple takes its prompt as one argv element; Linux caps a single
# argument at MAX_ARG_STRLEN = 32 pages = 131072 bytes, terminating NUL included.
_MAX_ARG_BYTES = 131071


def check(res: subprocess.CompletedProcess[bytes], cmd: Sequence[str]) -> None:
    if res.returncode != 0:
        tail = res.stderr.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{Path(cmd[0]).name} failed with rc={res.returncode}:\n{tail}")


def _simple(
    model: str | os.PathLike[str],
    prompt: str,
    n_predict: int,
    *,
    threads: int = 2,
    extra: Sequence[str] = (),
    echo: str | None = None,
) -> tuple[str, str]:
    """Greedy continuation of ``prompt`` by ``llama-simple``: the generated text and the log.

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
    cmd = [str(tool("llama-simple")), "-m", str(model), "-n", str(n_predict), *extra, prompt]
    env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
    res = subprocess.run(cmd, capture_output=True, env=env)
    check(res, cmd)
    out = res.stdout.decode(errors="replace")
    out = out[:-1] if out.endswith("\n") else out  # the final printf("\n")
    return after_prompt(out, echo if echo is not None else prompt, "llama-simple"), res.stderr.decode(errors="replace")


def run_simple(model: str | os.PathLike[str], prompt: str, n_predict: int, *, threads: int = 2,
               extra: Sequence[str] = ()) -> str:
    """Greedy continuation of ``prompt`` by ``llama-simple``: the generated text only (see
    :func:`_simple` for exactly what the tool does)."""
    return _simple(model, prompt, n_predict, threads=threads, extra=extra)[0]


def run_simple_timed(model: str | os.PathLike[str], prompt: str, n_predict: int, *,
                     threads: int = 2, extra: Sequence[str] = (),
                     echo: str | None = None) -> dict[str, Any]:
    """``llama-simple``'s greedy generation, timed as specdec's decode rate is: its
    ``llama_perf_context_print`` "eval time" line, the single-token decodes after the prompt
    pass (each with the greedy sampler's argmax over the vocabulary, as specdec's plain
    decoding does; llama-bench samples nothing). ``echo``: the prompt as the tool prints it
    back, when the vocabulary does not round-trip text. Returns ``text``, ``tok_s`` and
    ``n_eval`` (decodes timed)."""
    text, log = _simple(model, prompt, n_predict, threads=threads, extra=extra,
                        echo=echo)
    m = RE_EVAL.search(log)
    if m is None:
        raise RuntimeError(f"llama-simple printed no eval timing:\n{log[-2000:]}")
    ms, runs = float(m.group(1)), int(m.group(2))
    if runs < 1 or ms <= 0:
        raise RuntimeError(f"llama-simple timed no decode ({m.group(0).strip()})")
    return {"text": text, "tok_s": runs / ms * 1000.0, "n_eval": runs}


def run_bench(model: str | os.PathLike[str], *, n_gen: int = 128, threads: int = 2,
              reps: int = 3, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Plain decode speed from ``llama-bench -p 0 -n n_gen -t threads -r reps -o json``.

    llama-bench runs one warm-up, then ``reps`` timed generations of ``n_gen``
    tokens from an empty context, one token per decode (``extra``: more flags, e.g.
    ``--rpc``). Returns ``tok_s_mean``
    and ``tok_s_std`` (llama-bench's own avg_ts / stddev_ts over the reps),
    plus the raw per-rep ``samples_ts``.
    """
    cmd = [str(tool("llama-bench")), "-m", str(model), "-p", "0", "-n", str(n_gen),
           "-t", str(threads), "-r", str(reps), "-o", "json", *extra]
    res = subprocess.run(cmd, capture_output=True)
    check(res, cmd)
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
DRAFT_LEN_FLAG = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}

#: extra runs of a reference tool whose log lost its tail (see run_spec_simple)
LOST_LOG_RETRIES = 3


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
    draft: str | os.PathLike[str] | None = None,
    n_ctx: int | None = None,
) -> dict[str, Any]:
    """Greedy speculative generation by ``llama-speculative-simple``.

    The prompt goes through ``-f FILE`` (any length, any bytes; the tool drops
    one trailing newline from the file, so we write one extra). It is tokenized
    with add_special and parse_special true, like llama-simple. Sampling is
    ``--temp 0`` (greedy). ``n_max`` is the draft length: ``--spec-draft-n-max``
    for the draft-model types, and the type's own size option for the n-gram
    types (see ``DRAFT_LEN_FLAG``); other n-gram knobs go in ``extra``.
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
    The count actually produced is returned as ``n_predict``. Its context is ``n_ctx``, by
    default the model's training length (``-c 0``: on a 32k model, 32k cells to allocate per
    run), and its batch 2048 unless ``extra`` says otherwise; the prompt must fit in one batch.
    ``draft`` is the draft model of the ``draft-*`` types (``-md``, on ``threads`` threads).

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
        size_n = flag_value(extra, "--spec-ngram-simple-size-n", 12)
        if n_max < size_n:  # common_ngram_simple_draft returns nothing when size_m < size_n
            raise ValueError(f"ngram-simple never drafts when its draft length (n_max={n_max}) is "
                             f"below its key length (size-n={size_n}); pass "
                             f"extra=('--spec-ngram-simple-size-n', 'K') with K <= n_max")
    cmd = [str(tool("llama-speculative-simple")), "-m", str(model), "-n", str(n_predict - 1),
           "-t", str(threads), "--temp", "0", "--log-colors", "off",
           "--spec-type", spec_type, "--spec-draft-n-max", str(n_max)]
    for t in spec_type.split(","):
        if t in DRAFT_LEN_FLAG:
            cmd += [DRAFT_LEN_FLAG[t], str(n_max)]
    if n_ctx is not None:
        cmd += ["-c", str(n_ctx)]
    if draft is not None:
        cmd += ["-md", str(draft), "-td", str(threads)]
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(prompt.encode() + b"\n")
        f.flush()
        # --no-escape: common_params turns "\\n", "\\t", "\\r" ... in a prompt into control
        # characters by default, so a source file with escapes in its string literals (C, Python)
        # would be another prompt on this side than on specdec's
        cmd += ["-f", f.name, "--no-escape", *extra] + (["-v"] if drafts else [])
        # llama.cpp's logger writes from a thread and is never flushed at exit (common/log.cpp
        # leaks it on purpose), so a run can lose the tail of its log, summary included: seen
        # with -v in about 1 of 20 runs, and without -v as a log cut between the timing lines
        # and the counters. The log is in order, so a run whose whole summary arrived lost
        # nothing before it; any other run is run again.
        for _ in range(LOST_LOG_RETRIES + 1):
            res = subprocess.run(cmd, capture_output=True)
            check(res, cmd)
            err = res.stderr.decode(errors="replace")
            if summary_complete(err):
                break
        else:
            raise RuntimeError(f"llama-speculative-simple: no complete summary in "
                               f"{LOST_LOG_RETRIES + 1} runs ({shlex.join(cmd)}); the last "
                               f"ended:\n{err[-3000:]}")
    dec, enc = RE_DECODED.search(err), RE_ENCODED.search(err)
    out = res.stdout.decode(errors="replace")
    # stdout is "\n\n" + prompt echo + generation + "\n\n" + "\n\n" (two LOG("\n\n") at the end)
    out = out[:-4] if out.endswith("\n\n\n\n") else out
    return {
        "text": after_prompt(out, prompt if echo is None else echo, "llama-speculative-simple"),
        "tok_s": float(dec.group(3)),
        "n_predict": int(dec.group(1)),
        "decode_s": float(dec.group(2)),
        "n_prompt": int(enc.group(1)),
        "prompt_tok_s": float(enc.group(3)),
        "n_drafted": stat(err, "n_drafted"),
        "n_accepted": stat(err, "n_accept"),
        **({"drafts": parse_drafts(err)} if drafts else {}),
    }


