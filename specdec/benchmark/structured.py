"""``specdec bench --case structured``: JSON-schema extraction and classification, served.

A structured case (``matrix.structured_cases``) runs its methods as servers, the way apps
call them: ``specdec serve`` (plain, and each drafter under the schema: the grammar's forced
tokens lead every draft) and llama.cpp's ``llama-server`` (plain and each n-gram mode), with
``--slots`` / ``-np`` equal to the case's concurrency, the same threads and the same model.
Every request is a greedy ``/v1/completions`` with the same prompt under the same JSON
schema: specdec gets it in its ``json_schema`` field, llama-server as the GBNF of the same
language in its ``grammar`` field (``schema_gbnf``: llama-server's own schema converter lets
the model pad JSON with any whitespace, and gemma pretty-prints there, so the two would not
write the same answers). A *pass* sends four requests of a set (``structured_prompts``:
each round the set's next four, so that no drafter that remembers earlier answers is asked
for one it has seen), ``concurrency`` at a time, after an untimed one-token pass of the same
requests that puts their prompts into the server's prompt cache; its tok/s is its
completion tokens over its wall time. Rows are
(method, set): the median pass of ``reps`` rounds, the methods taking turns in rotating
order so that they share the machine's ups and downs; idle servers use no CPU. Both
servers keep their prompt caches, as served. A row's note gives its answers' mean length
and how many reached the token cap (``n_gen``, set well above the answers' length, so
that every side ends with its JSON).

Unconstrained plain decoding answers the same requests without the schema, each capped at
the length of its constrained answer (measured first, untimed): the same prompts and the
same number of tokens, so that ``constrained / unconstrained`` is the mask's cost alone.
Every constrained answer is checked against its schema (a specdec answer that fails is a
failed check; a peer's gets a note). In-process and untimed: every specdec drafter's
constrained output in exact mode must equal constrained plain decoding's token for token,
and so must specdec's constrained plain decoding under the GBNF llama-server gets (the two
languages agree on these answers).
"""
from __future__ import annotations

import functools
import http.client
import json
import os
import statistics
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .matrix import LLAMA_SERVER, SPECDEC, Case, Method
from .schema_gbnf import schema_gbnf
from .rows import Row
from .serve_load import run_concurrently
from .structured_prompts import SETS, Request, pass_requests

if TYPE_CHECKING:
    from .runner import Runner


@dataclass
class Pass:
    """One set of requests through one server."""

    tokens: int = 0
    wall_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    lengths: List[int] = field(default_factory=list)   # completion tokens per request
    invalid: int = 0                                   # answers that do not match the schema
    capped: int = 0                                    # answers cut at their max_tokens
    errors: List[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def matches(value: Any, schema: Dict[str, Any]) -> bool:
    """Whether ``value`` matches ``schema``, for the keywords the structured requests use
    (type, enum, properties, required, additionalProperties, items, maxItems, maxLength,
    minimum, maximum)."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", ()))
                and (schema.get("additionalProperties", True) is not False
                     or set(value) <= set(props))
                and all(matches(v, props[k]) for k, v in value.items() if k in props))
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(matches(v, schema.get("items", {})) for v in value))
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("integer", "number"):
        number = (int,) if kind == "integer" else (int, float)
        return (isinstance(value, number) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    return True


def _complete(port: int, body: Dict[str, Any]) -> Dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
        out: Dict[str, Any] = json.loads(data)
        return out
    finally:
        conn.close()


def run_pass(port: int, requests: Sequence[Request], *, concurrency: int,
             max_tokens: Sequence[int], constrained: bool, gbnf: bool = False) -> Pass:
    """``requests`` greedy, ``concurrency`` at a time, request ``i`` capped at
    ``max_tokens[i]`` tokens, each under its schema if ``constrained`` (``gbnf``: as its
    GBNF in the ``grammar`` field, for llama-server)."""
    lengths = [0] * len(requests)
    lock = threading.Lock()
    res = Pass()

    def one(i: int) -> None:
        req = requests[i]
        body: Dict[str, Any] = {"prompt": req.text, "max_tokens": max_tokens[i],
                                "temperature": 0}
        if constrained and gbnf:
            body["grammar"] = schema_gbnf(req.schema)
        elif constrained:
            body["json_schema"] = req.schema
        try:
            out = _complete(port, body)
        except Exception as e:  # noqa: BLE001 - counted, and the row says why
            with lock:
                res.errors.append(f"{type(e).__name__}: {e}")
            return
        usage = out.get("usage") or {}
        spec = usage.get("speculation") or {}           # specdec serve
        timings = out.get("timings") or {}              # llama-server
        ok = True
        if constrained:
            try:
                ok = matches(json.loads(out["choices"][0]["text"]), req.schema)
            except (ValueError, KeyError, IndexError):
                ok = False
        with lock:
            lengths[i] = int(usage.get("completion_tokens", 0))
            res.capped += (out["choices"][0].get("finish_reason") == "length"
                           if out.get("choices") else 0)
            res.tokens += lengths[i]
            res.drafted += int(spec.get("drafted", timings.get("draft_n", 0)) or 0)
            res.accepted += int(spec.get("accepted", timings.get("draft_n_accepted", 0)) or 0)
            res.invalid += not ok

    res.wall_s = run_concurrently(len(requests), concurrency, one)
    res.lengths = lengths
    return res


def structured_ratios(c: Any, put: Callable[..., None]) -> None:
    """A structured case's ratios (``c``: its rows, as ``report`` indexes them; ``put``:
    records one): the best constrained drafter over llama-server's best constrained n-gram
    mode and over constrained plain decoding, and what the mask costs plain decoding."""
    def best(side: str) -> Optional[str]:
        scored = [(c.score(m), m) for m in c.methods if c.meta[m].side == side
                  and c.meta[m].constraint and c.meta[m].family != "plain"]
        scored = [x for x in scored if x[0] > 0]
        return max(scored)[1] if scored else None
    ours, theirs = best(SPECDEC), best(LLAMA_SERVER)
    constraint = next(c.meta[m].constraint for m in c.methods if c.meta[m].constraint)
    plain, cplain = "specdec plain", f"specdec plain {constraint}"
    if ours and theirs:
        put(c.name, f"best specdec {constraint} / best llama-server n-gram {constraint}",
            c.ratio(ours, theirs), "vs-llama.cpp", 1.5)
    if ours and cplain in c.meta:
        put(c.name, f"best specdec {constraint} / {cplain}", c.ratio(ours, cplain), "speedup",
            1.3)
    if cplain in c.meta and plain in c.meta:
        put(c.name, f"{cplain} / {plain}", c.ratio(cplain, plain), "constraint-cost", 0.95)
    theirs_plain = f"llama-server plain {constraint}"
    if cplain in c.meta and theirs_plain in c.meta:
        put(c.name, f"{cplain} / {theirs_plain}", c.ratio(cplain, theirs_plain), "vs-llama.cpp")


def steps(case: Case, reps: int) -> int:
    """The runner's progress steps of a structured case: its passes and exact checks (the
    reference, the peer's grammar, each drafter)."""
    drafters = sum(1 for m in case.methods if m.side == SPECDEC and m.family != "plain")
    return len(case.prompts) * len(case.methods) * reps + 2 + drafters


def _server_key(m: Method) -> Method:
    """The server a method runs on: plain serves its constrained and unconstrained rows."""
    return replace(m, constraint="")


def _start_servers(runner: "Runner", case: Case, model: str, log_path: Path,
                   errors: Dict[Method, str]) -> Dict[Method, Any]:
    from . import llama_tools
    from .serve import ServerProcess, _llama_argv, _specdec_argv, free_port

    binary: Optional[Path] = None
    if not runner.peers_enabled:
        why: Optional[str] = "peers disabled (--no-peers)"
    elif not runner.build_peers and not llama_tools.built(["llama-server"]):
        why = "llama-server is not built (--no-build)"
    else:
        try:
            binary, why = llama_tools.ensure_tools(("llama-server",))["llama-server"], None
        except Exception as e:  # noqa: BLE001 - the rows say why
            why = f"llama-server did not build: {e}"
    servers: Dict[Method, Any] = {}
    c = case.concurrency
    for m in case.methods:
        key = _server_key(m)
        if key in servers or m in errors:
            continue
        if m.side == LLAMA_SERVER:
            if binary is None:
                errors[m] = why or "llama-server unavailable"
                continue
            argv: Callable[[int], List[str]] = functools.partial(
                _llama_argv, binary, model, slots=c, spec_type=m.drafter or None,
                threads=runner.threads, n_max=m.n_max or 1, extra=m.extra)
        else:
            argv = functools.partial(_specdec_argv, model, slots=c, drafter=m.drafter or None,
                                     threads=runner.threads, adaptive=m.adaptive,
                                     n_max=m.n_max or 4)
        port = free_port()
        try:
            servers[key] = ServerProcess(argv(port), port, log_path)
        except Exception as e:  # noqa: BLE001
            errors[m] = f"{type(e).__name__}: {str(e)[-300:]}"
    return servers


def run_case(runner: "Runner", case: Case) -> List[Row]:
    """Measure a structured case (see the module's docstring); its rows."""
    model = runner.models.target(case)
    log_path = Path(tempfile.gettempdir()) / f"specdec-bench-{case.name}-{os.getpid()}.log"
    errors: Dict[Method, str] = {}
    servers = _start_servers(runner, case, model, log_path, errors)
    passes: Dict[Method, Dict[str, List[Pass]]] = {m: {s.name: [] for s in case.prompts}
                                                  for m in case.methods}
    cplain = next(m for m in case.methods if m.side == SPECDEC and m.family == "plain"
                  and m.constraint)
    try:
        caps: Dict[str, List[int]] = {}
        for p in case.prompts:
            reqs = SETS[p.name]
            full = [case.n_gen] * len(reqs)
            # warm-up (first batch shapes) on the last group, which the first rounds do not send
            warm = [reqs[i] for i in pass_requests(len(reqs), -1)][:case.concurrency]
            for key, srv in servers.items():
                run_pass(srv.port, warm, concurrency=case.concurrency,
                         max_tokens=[8] * len(warm), constrained=True,
                         gbnf=key.side == LLAMA_SERVER)
            # the unconstrained rows' caps: the constrained answers' lengths (plain decoding,
            # which remembers no answer)
            srv = servers.get(_server_key(cplain))
            first = (run_pass(srv.port, reqs, concurrency=1, max_tokens=full, constrained=True)
                     if srv is not None else Pass(lengths=full))
            caps[p.name] = [n or case.n_gen for n in first.lengths]
        names = [m for m in case.methods if m not in errors]
        for rep in range(runner.m.reps if names else 0):     # no server up: the rows say why
            for p in case.prompts:
                idx = pass_requests(len(SETS[p.name]), rep)
                reqs = [SETS[p.name][i] for i in idx]
                for m in names[rep % len(names):] + names[:rep % len(names)]:
                    port, gbnf = servers[_server_key(m)].port, m.side == LLAMA_SERVER
                    # the prompts into the server's prompt cache, untimed (one token each):
                    # the timed pass decodes, as it did when every round sent the same prompts
                    run_pass(port, reqs, concurrency=case.concurrency, max_tokens=[1] * len(reqs),
                             constrained=bool(m.constraint), gbnf=gbnf)
                    got = run_pass(port, reqs, concurrency=case.concurrency,
                                   max_tokens=([caps[p.name][i] for i in idx] if not m.constraint
                                               else [case.n_gen] * len(reqs)),
                                   constrained=bool(m.constraint), gbnf=gbnf)
                    passes[m][p.name].append(got)
                    runner._tick(f"{case.name} {p.name} {m.label}: {got.tok_s:.1f} tok/s")
    finally:
        for srv in servers.values():
            srv.stop()
    rows = [_row(case, p.name, m, passes[m][p.name], errors.get(m))
            for p in case.prompts for m in case.methods]
    _exact_check(runner, case, model, rows)
    return rows


def _row(case: Case, prompt: str, m: Method, got: List[Pass], error: Optional[str]) -> Row:
    r = Row(case.name, prompt, prompt, m.label, m.side, m.family, m.drafter, m.n_max,
            m.adaptive, m.exact, m.temperature, constraint=m.constraint)
    if error is not None or not got:
        r.status, r.note = ("unavailable" if error else "error"), error or "no pass ran"
        return r
    failed = [e for g in got for e in g.errors]
    if failed:
        r.status, r.note = "error", failed[0][:300]
        return r
    r.tok_s_runs = [g.tok_s for g in got]
    r.tok_s = statistics.median(r.tok_s_runs)
    r.drafted, r.accepted = got[-1].drafted, got[-1].accepted
    invalid = sum(g.invalid for g in got)
    n = sum(len(g.lengths) for g in got)
    capped = sum(g.capped for g in got)
    notes = [f"concurrency {case.concurrency}, {len(got[-1].lengths)} requests per pass, "
             f"{statistics.mean(got[-1].lengths):.1f} tokens per answer"]
    if capped:
        notes.append(f"{capped} of {n} answers reached the {case.n_gen}-token cap")
    if invalid:
        notes.append(f"{invalid} of {n} answers do not match their schema")
        if m.side == SPECDEC:
            r.check = f"error: {invalid} of {n} answers do not match their schema"
    r.note = "; ".join(notes)
    return r


#: verdicts of the exact check by what decides them (the model, the requests, the lengths,
#: the methods): the cases of one run at concurrency 1 and 4 check the same requests in
#: process, so the second takes the first's verdicts
_VERDICTS: Dict[str, Tuple[str, str, Dict[str, str]]] = {}


def _exact_check(runner: "Runner", case: Case, path: str, rows: List[Row]) -> None:
    """Exact mode, in-process: each specdec drafter's constrained output must equal
    constrained plain decoding's, request by request (every request of the sets); and
    constrained plain decoding under llama-server's GBNF (``schema_gbnf``) must give the
    schema's answers, whole: the peer's constrained rows get that verdict."""
    n = runner.m.check_tokens
    reqs = [r for p in case.prompts for r in SETS[p.name]]
    checked = [m for m in case.methods if m.side == SPECDEC and m.constraint
               and m.family != "plain"]
    key = json.dumps([path, n, case.n_gen, runner.threads, [[r.text, r.schema] for r in reqs],
                      [repr(m) for m in checked]], sort_keys=True)
    if key not in _VERDICTS:
        _VERDICTS[key] = (case.name, *_exact_verdicts(runner, case, path, reqs, checked))
    else:
        first, language, verdicts = _VERDICTS[key]
        runner._tick(f"exact check {case.name}: the same requests as {first}")
        runner._tick(f"exact check {case.name}: llama-server's GBNF gives the schema's answers: "
                     f"{language}")
        for m in checked:
            runner._tick(f"exact check {case.name} {m.label}: {verdicts[m.label]} (as {first})")
    _, language, verdicts = _VERDICTS[key]
    for m in case.methods:
        if m.side == LLAMA_SERVER and m.constraint:
            verdict = language
        elif m.side == SPECDEC and m.constraint:
            verdict = "ref" if m.family == "plain" else verdicts[m.label]
        else:
            continue
        for r in rows:
            if r.method == m.label and r.status == "ok" and not r.check:
                r.check = verdict


def _exact_verdicts(runner: "Runner", case: Case, path: str, reqs: List[Request],
                    checked: List[Method]) -> Tuple[str, Dict[str, str]]:
    """``_exact_check``'s decodes: the verdict on llama-server's GBNF, and each of
    ``checked``'s (by label)."""
    from .. import api
    from .._core import Model

    n = runner.m.check_tokens
    model = Model(path, use_extra_bufts=False)
    n_ctx = max(512, max(len(model.tokenize(r.text)) for r in reqs) + max(n, case.n_gen) + 64)

    def outputs(m: Method, n: int = n, gbnf: bool = False) -> List[List[int]]:
        dec = api.Decoder(model, drafter=m.drafter or None, n_max=m.n_max or 4,
                          adaptive=m.adaptive, exact=True, n_ctx=n_ctx, n_threads=runner.threads)
        return [dec.generate(r.text, max_tokens=n,
                             **({"grammar": schema_gbnf(r.schema)} if gbnf
                                else {"json_schema": r.schema})).tokens for r in reqs]

    ref = outputs(Method(SPECDEC, "plain"))
    runner._tick(f"exact check {case.name}: constrained plain reference")
    try:
        plain = Method(SPECDEC, "plain")
        same = outputs(plain, case.n_gen) == outputs(plain, case.n_gen, gbnf=True)
        language = "PASS" if same else "FAIL"
    except Exception as e:  # noqa: BLE001
        language = f"error: {type(e).__name__}: {e}"
    runner._tick(f"exact check {case.name}: llama-server's GBNF gives the schema's answers: "
                 f"{language}")
    verdicts: Dict[str, str] = {}
    for m in checked:
        try:
            verdicts[m.label] = "PASS" if outputs(m) == ref else "FAIL"
        except Exception as e:  # noqa: BLE001
            verdicts[m.label] = f"error: {type(e).__name__}: {e}"
        runner._tick(f"exact check {case.name} {m.label}: {verdicts[m.label]}")
    return language, verdicts
