"""Parse what llama.cpp's tools print: the generated text after the prompt's echo, the
timing summary and counters of ``llama-speculative-simple``, and its ``-v`` draft log."""
from __future__ import annotations

import re
from collections.abc import Sequence

RE_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
RE_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
#: llama_perf_context_print's decode line (the prompt pass is its own "prompt eval time" line)
RE_EVAL = re.compile(r"(?<!prompt )eval time =\s+([\d.]+) ms /\s+(\d+) runs")



def after_prompt(out: str, prompt: str, tool: str) -> str:
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


def flag_value(args: Sequence[str], flag: str, default: int) -> int:
    """Last value given for ``flag`` in ``args`` (llama.cpp's parser keeps the last one)."""
    value = default
    for i, a in enumerate(args[:-1]):
        if a == flag:
            value = int(args[i + 1])
    return value


def _stat_match(text: str, key: str) -> re.Match[str] | None:
    # lines carry common_log's "M.SS.mmm.uuu I " prefix on stderr, so no ^ anchor
    return re.search(rf"\b{key}\s*=\s*(\d+)\s*$", text, re.M)


def stat(text: str, key: str) -> int:
    m = _stat_match(text, key)
    if m is None:
        raise RuntimeError(f"llama-speculative-simple: no '{key} =' line in its summary")
    return int(m.group(1))


def summary_complete(text: str) -> bool:
    """Whether a llama-speculative-simple log holds every summary line we read: both timing
    lines and the counters up to ``n_accept``, printed after them."""
    return (RE_DECODED.search(text) is not None and RE_ENCODED.search(text) is not None
            and _stat_match(text, "n_drafted") is not None
            and _stat_match(text, "n_accept") is not None)


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


