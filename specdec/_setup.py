"""Model, drafters and target context from the user's options: shared by Decoder and Engine."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

from ._archs import LAZY_MTP_ARCHS
from ._core import Context, Model, TargetView
from .config import SpecConfig
from .head_choice import choose as choose_head
from .drafters import Drafter, create as create_drafter
from .drafters.guard import guard
from .placement import Placement

PathLike = Union[str, "os.PathLike[str]"]
DrafterSpec = Union[str, Drafter, Any]

#: a drafter spec meaning no drafter (plain decoding): the Decoder's ``drafter=``, the
#: Engine's ``drafters=``/``default_drafter=`` and a request's ``drafter=`` all take it
PLAIN = "plain"


def as_list(drafter: Union[DrafterSpec, Sequence[DrafterSpec], None]) -> List[DrafterSpec]:
    """The drafter specs a Decoder or Engine loads (``None`` or ``"plain"``: none)."""
    if drafter is None:
        return []
    specs = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]
    if any(isinstance(s, str) and s == PLAIN for s in specs):
        if len(specs) > 1:
            raise ValueError(f"{PLAIN!r} means no drafter: it cannot be chained with others "
                             f"(got {specs!r})")
        return []
    return specs


def check_room(n_ctx: Any, n_seq_max: Any, n_max: int) -> None:
    """A context too small to verify a draft is refused by name (llama.cpp would cap n_batch
    at n_ctx and the controller would then speak of n_batch)."""
    if n_max and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                     for v in (n_ctx, n_seq_max)) and n_ctx // n_seq_max < n_max + 2:
        raise ValueError(f"n_ctx={n_ctx} is too small for drafts of n_max={n_max}: each of the "
                         f"{n_seq_max} sequence(s) needs a prompt token and a verify batch of "
                         f"n_max + 1 tokens (n_ctx >= {(n_max + 2) * n_seq_max})")


def exact_slack(spec: SpecConfig, exact: bool) -> int:
    """Positions past a sequence's context that exact mode's padding rows may take: a verify
    has two rows or more, every sequence of it the same number (up to ``n_max + 1``), even
    where the sequence has room for one more token only."""
    return max(spec.n_max + 1, 2) if exact else 0


def load_model(model: Union[Model, PathLike], specs: List[DrafterSpec], *, exact: bool,
               placement: Placement, load_mtp: Optional[bool], model_check: str) -> Model:
    if isinstance(model, Model):
        if exact and model.use_extra_bufts:
            raise ValueError("exact=True needs the model loaded with use_extra_bufts=False "
                             "(or pass a path and let the Decoder load it)")
        if placement != Placement():
            raise ValueError("placement options (n_gpu_layers, rpc_servers, ...) apply when "
                             "the Decoder loads the model: pass them to Model(...) instead")
        return model
    wants_mtp = any(s.needs_mtp_hidden if isinstance(s, Drafter)
                    else isinstance(s, str) and s.split(":", 1)[0] == "mtp" for s in specs)
    return Model(model, load_mtp=wants_mtp if load_mtp is None else load_mtp,
                 use_extra_bufts=not exact, check=model_check, **placement.options())


def make_drafters(specs: List[DrafterSpec], spec: SpecConfig, *,
                  drafter_timeout: Optional[float], on_drafter_error: str,
                  n_gpu_layers_draft: Optional[int]) -> List[Drafter]:
    created = [create_drafter(s) for s in specs]
    if n_gpu_layers_draft is not None:
        placed = [d for d in created if d.has_model]
        if not placed:
            raise ValueError("n_gpu_layers_draft applies to drafters with a model of their "
                             "own (draft:PATH, layerskip:N, mtp); none is in use")
        for d in placed:
            d.n_gpu_layers = n_gpu_layers_draft
    for d in created:
        d.configure(spec)
    return [guard(d, drafter_timeout, on_drafter_error) for d in created]


def needs_hidden_rows(drafters: Sequence[Drafter]) -> Optional[str]:
    """The MTP hidden-state mode one of the drafters reads from the target (None: none does)."""
    return "dense" if any(d.needs_mtp_hidden for d in drafters) else None


def _check_invariance(ctx: Context, rows: int) -> None:
    """Exact mode with layers on a GPU or RPC servers: their kernels must be shown
    batch-invariant for every verify batch this context will decode, or exact mode is refused,
    saying how long a draft the device does hold for."""
    bad = ctx.check_batch_invariance(rows)
    if not bad:
        return
    # the longest verify batch that does hold: each failed check names a smaller row count
    holds = bad
    while holds > 2:
        worse = ctx.check_batch_invariance(holds)
        if not worse:
            break
        holds = worse
    ctx.close()
    others = [b for b in ctx.backends if b != "CPU"]
    n_max_ok = holds // ctx.n_seq_max - 1
    where = (f"up to n_max={n_max_ok} (verify batches of up to {holds} rows) on this device"
             if n_max_ok >= 1 else "for no draft length on this device")
    fix = ("start every server with `specdec rpc-server --batch-invariant`"
           if all(b.startswith("RPC") for b in others)
           else "keep the target on the CPU (n_gpu_layers=0), whose kernels specdec makes "
                "batch-invariant, or use exact=False")
    raise ValueError(f"exact=True: the kernels of {', '.join(others)} are not batch-invariant "
                     f"(a row's logits differ between verify batches of {bad} and {rows} rows), "
                     f"so exact output cannot be promised for these drafts; it holds "
                     f"{where}; or {fix}")


LazyLogits = Union[bool, str, None]


#: the widest decode the LM head choice times (``head_choice``): Gemma's lazy head costs ~3.7 ms
#: a row on a 2-core EPYC, and each shape is timed 12 times each way
HEAD_ROWS_TIMED = 128


def make_context(model: Model, drafters: List[Drafter], spec: SpecConfig, *, n_ctx: int,
                 n_batch: int, n_ubatch: Optional[int], n_threads: Optional[int],
                 n_seq_max: int, exact: bool, lazy_logits: LazyLogits,
                 kv_unified: Optional[bool] = None) -> Context:
    """The target context, sized for verify batches of every sequence, and the drafters
    bound to it (they read the target through a :class:`TargetView`).

    ``lazy_logits``: True or False forces the lazy LM head on or off; ``"auto"`` (or None)
    puts it on where it can run and then keeps whichever head measures faster for this
    model on this machine (:mod:`specdec.head_choice`, cached)."""
    if lazy_logits is None:
        lazy_logits = "auto"
    if not isinstance(lazy_logits, bool) and lazy_logits != "auto":
        raise ValueError(f"lazy_logits must be True, False or 'auto', got {lazy_logits!r}")
    n_max = spec.n_max if drafters else 0
    # recurrent state rolled back by n_rollback snapshots (the others use checkpoints)
    recurrent = (model.is_recurrent or model.is_hybrid) and model.supports_partial_rollback
    rollback = max([d.rollback_depth for d in drafters], default=0)
    nextn = needs_hidden_rows(drafters)
    measured = lazy_logits == "auto"
    if measured:
        # off the host (any offloaded layer takes the output layer with it) the head
        # cannot be read, and a device's LM head is cheap anyway
        lazy_logits = ((nextn is None or model.arch in LAZY_MTP_ARCHS)
                       and model.placement.n_gpu_layers == 0)
    check_room(n_ctx, n_seq_max, n_max)
    # exact mode pads every sequence of a verify to the same rows, at least two
    verify_rows = n_seq_max * max(n_max + 1, 2 if exact and n_seq_max > 1 else 1)
    if exact and n_ubatch is not None and n_ubatch < max(verify_rows, 2):
        # a verify split into ubatches could leave a single row, which other kernels compute
        raise ValueError(f"exact=True needs n_ubatch >= {max(verify_rows, 2)} (n_seq_max * "
                         f"(n_max + 1)) so that no verify batch is split; got {n_ubatch}")
    ctx = Context(
        model, n_ctx=n_ctx, n_batch=max(n_batch, verify_rows),
        n_ubatch=n_ubatch, n_threads=n_threads, n_seq_max=n_seq_max,
        n_rollback=max(rollback, int(exact)) if recurrent and (rollback or exact) else 0,
        mtp_hidden=nextn, lazy_logits=bool(lazy_logits), batch_invariant=exact, kv_unified=kv_unified)
    if exact and ctx.invariant_rows == 0:
        _check_invariance(ctx, max(verify_rows, 2))
    elif model.is_remote:
        # verify shapes set up before the first request (exact mode's check decodes them)
        ctx.warm_up(min(n_max + 1, ctx.n_batch))
    if measured and lazy_logits and not model.is_remote:
        # timed up to the largest decode a round makes: every sequence's verify at once (an
        # Engine's plain step of n_seq_max rows when nothing drafts), so the rows where the
        # two heads cross are found within the shapes the rounds decode
        # (one sequence holds the timed rows: at most its room, and one ubatch; at most
        # HEAD_ROWS_TIMED, whose timing on Gemma takes seconds, once per model and setting)
        widest = min(n_seq_max * (n_max + 1), ctx.n_ubatch, ctx.n_ctx_seq, HEAD_ROWS_TIMED)
        choose_head(ctx, verify_rows=widest if widest > 1 else 0, exact=exact)
    target = TargetView(ctx)   # drafters read the target; only the controller writes
    for d in drafters:
        d.bind(target, n_seq_max)
    return ctx
