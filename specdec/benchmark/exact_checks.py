"""The benchmark's exact-mode checks: every specdec method timed in a case must give plain
greedy decoding's tokens when run with ``exact=True`` (batch-invariant kernels), and an
oracle drafter that proposes the plain output itself must be accepted in full at every
verify batch size. They run after a case is timed, untimed, and write their verdicts into
the case's rows and the run's ``oracle_checks``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

from .. import api
from .._core import Model
from .matrix import SPECDEC, Case, Method
from .oracle import Oracle
from .rows import BOS_PROMPT, Row, is_interleaved

if TYPE_CHECKING:
    from .runner import Runner


def exact_check(runner: "Runner", case: Case, target: str, mtp: bool, rows: List[Row],
                exact_model: Optional[Model] = None) -> None:
    """Exact mode: every specdec method's greedy tokens must equal plain greedy tokens.
    ``exact_model``: the case's model loaded for exact mode already (else loaded here)."""
    n = runner.m.check_tokens
    if case.rpc_delay_ms is not None or runner._placement:
        # exact mode needs batch-invariant kernels, which the servers and devices do not
        # promise (tests/test_gpu.py checks the device's); the CPU matrices check the same
        # drafters, and ``match`` compares with plain decoding on the same device
        where = "remote" if case.rpc_delay_ms is not None else "device"
        for r in rows:
            if r.side == SPECDEC and r.status == "ok" and r.prompt != BOS_PROMPT:
                r.check = f"n/a ({where})"
        return
    try:
        model = (exact_model if exact_model is not None
                 else Model(target, load_mtp=mtp, use_extra_bufts=False))
    except Exception as e:  # noqa: BLE001
        for r in rows:
            if r.side == SPECDEC and r.family != "plain" and r.status == "ok":
                r.check = f"error: {e}"
        return
    methods = {}
    for r in rows:
        # (the timed oracle is the exact check's own reference, checked in oracle_check)
        if (r.side == SPECDEC and r.prompt != BOS_PROMPT and not is_interleaved(r.prompt)
                and r.family != "oracle"):
            # a method timed in exact mode is the same method to check: checked once
            methods.setdefault(r.method.removesuffix(" exact"),
                               Method(SPECDEC, r.family, r.drafter, r.n_max, r.adaptive))
    plain_dec = runner._decoder(model, Method(SPECDEC, "plain"), n, case.prompts, exact=True)
    ref = {p.name: plain_dec.generate(p.text, max_tokens=n).tokens for p in case.prompts}
    runner._tick(f"exact check {case.name}: plain reference")
    for label, m in methods.items():
        if m.family == "plain":
            continue
        try:
            dec = runner._decoder(model, m, n, case.prompts, exact=True)
            got = {p.name: dec.generate(p.text, max_tokens=n).tokens for p in case.prompts}
            err = None
        except Exception as e:  # noqa: BLE001
            got, err = {}, f"error: {type(e).__name__}: {e}"
        for r in rows:
            if r.method.removesuffix(" exact") == label and r.prompt in ref:
                r.check = err or ("PASS" if got[r.prompt] == ref[r.prompt] else "FAIL")
        runner._tick(f"exact check {case.name} {label}: "
                   f"{err or ('PASS' if all(got[k] == ref[k] for k in ref) else 'FAIL')}")
    for r in rows:
        if r.side == SPECDEC and r.family == "plain" and r.prompt != BOS_PROMPT:
            r.check = "ref" if not r.temperature else ""
    oracle_check(runner, case, model, plain_dec, ref)

def oracle_check(runner: "Runner", case: Case, model: Model, plain_dec: api.Decoder,
                 ref: Dict[str, List[int]]) -> None:
    """Exact mode at every verify batch size up to ``max(oracle_check_n_max) + 1`` rows: a
    drafter that proposes the plain output itself must be accepted in full and change
    nothing, whatever drafters the case times."""
    n = runner.m.check_tokens
    book = {tuple(plain_dec.tokenize(p.text)): ref[p.name] for p in case.prompts}
    for k in runner.m.oracle_check_n_max:
        dec = api.Decoder(model, drafter=Oracle(book), n_max=k, exact=True,
                          n_ctx=runner._n_ctx(model, n, case.prompts), n_threads=runner.threads)
        verdicts = []
        for p in case.prompts:
            try:
                res = dec.generate(p.text, max_tokens=n)
                ok = res.tokens == ref[p.name] and res.stats.accepted == res.stats.drafted
                verdicts.append("PASS" if ok else "FAIL")
            except Exception as e:  # noqa: BLE001
                verdicts.append(f"error: {type(e).__name__}: {e}")
            runner._oracle_checks.append({"case": case.name, "prompt": p.name, "n_max": k,
                                        "check": verdicts[-1]})
        runner._tick(f"exact check {case.name} oracle n{k}: "
                   f"{'PASS' if all(v == 'PASS' for v in verdicts) else 'FAIL'}")
