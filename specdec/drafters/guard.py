"""Fault isolation for Python drafters: a deadline on each hook, and errors turned into plain rounds.

A plugin drafter can raise, return garbage, or hang. By default a faulty answer raises
:class:`DrafterError` before the target sees it (the decoder stays usable). Wrapped by
:class:`GuardedDrafter` (``Decoder(drafter_timeout=..., on_drafter_error="disable")``),
the drafter instead runs each hook in a worker thread with a deadline; on a timeout,
or on an error when ``on_error="disable"``, the drafter is switched off for the rest of
the request with a :class:`DrafterFaultWarning`, and its rounds decode plainly (the
target's output is the same, only slower). A timeout always disables: the drafter is
still running in its thread, and Python cannot kill a thread, so it is not called again
until that call returns; a drafter hung forever stays off and its thread stays blocked
(a daemon thread: it does not keep the process alive). The worker thread ends when its
drafter is closed or garbage-collected (with its Decoder).
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import warnings
import weakref
from typing import Any, List, Optional

from ._base import Drafter, DrafterError, check_draft
from ._run import run_accept, run_begin, run_observe, run_reset

ON_ERROR = ("raise", "disable")


class DrafterFaultWarning(RuntimeWarning):
    """A drafter timed out or failed and was switched off for the rest of the request."""


def is_python_drafter(d: Drafter) -> bool:
    """A drafter whose ``propose`` or ``propose_batch`` is Python code (built-ins draft in C
    and are not wrapped)."""
    return (type(d).propose is not Drafter.propose
            or type(d).propose_batch is not Drafter.propose_batch)


class _Worker:
    """One daemon thread that runs calls with a deadline; a hung call blocks only this thread
    (a daemon: it never holds up interpreter exit, unlike a ThreadPoolExecutor's threads)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self.pending: Optional[concurrent.futures.Future] = None

    def _loop(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            fut, fn, args = item
            del item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:   # handed to the caller, whatever it is
                    fut.set_exception(e)
            # hold nothing of the call while waiting: a bound hook would keep its drafter
            # (and the drafter's target context) alive, and the finalizer below from running
            del fut, fn, args

    def call(self, timeout: float, fn, *args) -> Any:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"specdec-drafter-{self._name}",
                                            daemon=True)
            self._thread.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fut, fn, args))
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.pending = fut
            raise

    @property
    def busy(self) -> bool:
        return self.pending is not None and not self.pending.done()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None


class GuardedDrafter(Drafter):
    """Wraps a Python drafter: hooks run with a deadline; faults disable it for the request."""

    def __init__(self, inner: Drafter, *, timeout: Optional[float] = None,
                 on_error: str = "raise") -> None:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise ValueError(f"drafter_timeout must be a positive number of seconds, got {timeout!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_drafter_error must be one of {ON_ERROR}, got {on_error!r}")
        super().__init__(inner.name or type(inner).__name__)
        self.inner = inner
        self.timeout = None if timeout is None else float(timeout)
        self.on_error = on_error
        self.disabled = False
        self.faults: List[str] = []
        self._worker = _Worker(self.name) if self.timeout is not None else None
        if self._worker is not None:
            # the thread ends with the drafter (the worker holds no reference back to it)
            weakref.finalize(self, self._worker.close)
        self._n_vocab = 0

    # --- the rest of the contract: the wrapped drafter's -------------------------------

    def configure(self, spec) -> None:
        Drafter.configure(self, spec)
        self.inner.configure(spec)

    @property
    def needs_mtp_hidden(self) -> bool:
        return self.inner.needs_mtp_hidden

    @property
    def rollback_depth(self) -> int:
        return self.inner.rollback_depth

    @property
    def has_model(self) -> bool:
        return self.inner.has_model

    def forget_text(self) -> None:
        self.inner.forget_text()

    def get_state(self) -> Any:
        return self.inner.get_state()

    def set_state(self, state: Any) -> None:
        self.inner.set_state(state)

    def bind(self, target, n_seq: int = 1) -> None:
        Drafter.bind(self, target, n_seq)
        self.inner.bind(target, n_seq)
        self._n_vocab = target.n_vocab

    def _fault(self, what: str) -> None:
        self.disabled = True
        self.faults.append(what)
        warnings.warn(f"drafter {self.name!r} {what}; it is off for the rest of this request "
                      "(those rounds decode without drafts)", DrafterFaultWarning, stacklevel=4)

    def _run(self, hook: str, fn, *args) -> Any:
        if self.disabled:
            return None
        try:
            if self._worker is None:
                return fn(*args)
            return self._worker.call(self.timeout, fn, *args)
        except concurrent.futures.TimeoutError:
            self._fault(f"took longer than drafter_timeout={self.timeout:g}s in {hook}()")
            return None
        except Exception as e:
            if self.on_error == "raise":
                if isinstance(e, DrafterError):
                    raise
                raise DrafterError(f"drafter {self.name!r} raised in {hook}(): "
                                   f"{type(e).__name__}: {e}") from e
            self._fault(f"failed in {hook}(): {type(e).__name__}: {e}")
            return None

    # --- hooks ---------------------------------------------------------------------------

    def begin(self, seq, prompt_tokens):
        if self._worker is not None and self._worker.busy:
            # the call that timed out is still running: do not touch the drafter
            self.disabled = True
            return
        self.disabled = False
        self._run("begin", run_begin, self.inner, seq, prompt_tokens)

    def observe(self, seq, tokens):
        self._run("observe", run_observe, self.inner, seq, tokens, self.observe_row)

    def _propose(self, seq, last_token, n_max):
        res = self.inner.propose(seq, last_token, n_max)
        check_draft(res, n_max, self._n_vocab, self.name)
        return res

    def propose(self, seq, last_token, n_max):
        res = self._run("propose", self._propose, seq, last_token, n_max)
        return [] if res is None else res

    def _propose_batch(self, seqs, last_tokens, n_maxs):
        res = self.inner.propose_batch(seqs, last_tokens, n_maxs)
        if isinstance(res, (str, bytes)) or not hasattr(res, "__len__") or len(res) != len(seqs):
            raise DrafterError(f"drafter {self.name!r}: propose_batch must return one answer "
                               f"per sequence ({len(seqs)})")
        for r, n in zip(res, n_maxs):
            check_draft(r, n, self._n_vocab, self.name)
        return res

    def propose_batch(self, seqs, last_tokens, n_maxs):
        """The wrapped drafter's drafts of the round's sequences, in one call with a deadline
        (a fault disables it: no drafts)."""
        res = self._run("propose_batch", self._propose_batch, list(seqs), list(last_tokens),
                        list(n_maxs))
        return [[] for _ in seqs] if res is None else res

    def accept(self, seq, n_accepted):
        self._run("accept", run_accept, self.inner, seq, n_accepted)

    def reset(self, seq):
        self._run("reset", run_reset, self.inner, seq)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self.inner.close()


def guard(d: Drafter, timeout: Optional[float], on_error: str) -> Drafter:
    """``d`` wrapped when it is a Python drafter and a guard is asked for; else ``d``."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_drafter_error must be one of {ON_ERROR}, got {on_error!r}")
    if (timeout is None and on_error == "raise") or not is_python_drafter(d):
        if timeout is not None:
            GuardedDrafter(d, timeout=timeout)   # validates the value
        return d
    return GuardedDrafter(d, timeout=timeout, on_error=on_error)
