"""llama-cpp-python side of the benchmark, run as a script by the peer venv's python.

It never imports specdec: it runs in its own process so that llama-cpp-python's
libllama and specdec's never share one. Protocol: one JSON request per stdin line,
one JSON reply per stdout line.

    {"op": "load", "key": K, "model": PATH, "kind": "plain"|"pld"|"draft", ...}
    {"op": "run", "key": K, "prompt": TEXT, "n_gen": N}   -> {"tok_s", "tokens", ...}

Timing matches specdec's and llama.cpp's: the first token comes from the prompt pass,
so the rate is (n - 1) tokens over the time from the first token to the last.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import numpy as np


def _draft_adapter(path: str, n_ctx: int, threads: int, n_max: int):
    """A ``LlamaDraftModel`` that drafts greedily with a second (smaller) GGUF.

    llama-cpp-python ships no draft-LLM class (only prompt lookup), so this is the
    minimal one: it keeps the draft's KV cache for the common prefix and rolls back
    the rest, then decodes ``n_max`` argmax tokens one at a time.
    """
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaDraftModel

    class DraftLLM(LlamaDraftModel):
        def __init__(self) -> None:
            self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                       n_batch=512, verbose=False)
            self.n_vocab = self.llm.n_vocab()

        def _argmax(self) -> int:
            ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
            return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

        def __call__(self, input_ids, /, **kwargs):
            llm = self.llm
            ids = np.asarray(input_ids, dtype=np.intc)
            have = llm.input_ids[:llm.n_tokens]
            n = min(len(have), len(ids) - 1)
            common = int(np.argmax(have[:n] != ids[:n])) if n and (have[:n] != ids[:n]).any() else n
            llm.n_tokens = common
            llm.eval(ids[common:].tolist())
            out = []
            for _ in range(n_max):
                tok = self._argmax()
                out.append(tok)
                if len(out) < n_max:
                    llm.eval([tok])
            return np.array(out, dtype=np.intc)

    return DraftLLM()


class _Counting:
    """Wraps a draft model to count rounds and drafted tokens (for acceptance)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0
        self.drafted = 0

    def __call__(self, input_ids, /, **kwargs):
        out = self.inner(input_ids, **kwargs)
        self.calls += 1
        self.drafted += len(out)
        return out


def _load(req: dict):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

    kind = req["kind"]
    threads = int(req.get("threads", 2))
    n_ctx = int(req.get("n_ctx", 4096))
    draft = None
    if kind == "pld":
        draft = LlamaPromptLookupDecoding(max_ngram_size=int(req.get("ngram", 2)),
                                          num_pred_tokens=int(req["n_max"]))
    elif kind == "draft":
        draft = _draft_adapter(req["draft_model"], n_ctx, threads, int(req["n_max"]))
    elif kind != "plain":
        raise ValueError(f"unknown kind {kind!r}")
    counting = None
    if draft is not None:
        counting = _Counting(draft)

        class _Adapter(LlamaDraftModel):   # Llama checks nothing, but keep the declared type
            def __call__(self, input_ids, /, **kwargs):
                return counting(input_ids, **kwargs)
        draft = _Adapter()
    llm = llama_cpp.Llama(req["model"], n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          n_batch=512, draft_model=draft, verbose=False,
                          logits_all=draft is not None)
    return llm, counting


def _run(llm, counting, req: dict) -> dict:
    n_gen = int(req["n_gen"])
    tokens = llm.tokenize(req["prompt"].encode(), add_bos=True, special=True)
    if counting is not None:
        counting.calls = counting.drafted = 0
    eos = {llm.token_eos()}
    out, t_first, t_last = [], 0.0, 0.0
    for tok in llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                            reset=True):
        now = time.perf_counter()
        if not out:
            t_first = now
        t_last = now
        if tok in eos:
            break
        out.append(int(tok))
        if len(out) >= n_gen:
            break
    dt = t_last - t_first
    res = {"tokens": out, "n": len(out), "tok_s": (len(out) - 1) / dt if dt > 0 else 0.0,
           "text": llm.detokenize(out).decode("utf-8", "replace")}
    if counting is not None:
        rounds = max(counting.calls - 1, 0)     # the last draft is never verified
        res["drafted"] = counting.drafted
        res["accepted"] = max(len(out) - 1 - rounds, 0)
    return res


def main() -> int:
    loaded: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if req["op"] == "load":
                loaded[req["key"]] = _load(req)
                reply: dict = {"ok": True}
            elif req["op"] == "run":
                reply = dict(_run(*loaded[req["key"]], req), ok=True)
            elif req["op"] == "version":
                import llama_cpp
                reply = {"ok": True, "version": llama_cpp.__version__}
            else:
                reply = {"ok": False, "error": f"unknown op {req['op']!r}"}
        except Exception as e:  # noqa: BLE001 - reported to the parent as a row saying why
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "trace": traceback.format_exc()[-2000:]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
