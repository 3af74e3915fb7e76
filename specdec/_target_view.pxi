# Part of _core (included by _core.pyx): TargetView, a drafter's read-only view of the
# target context.

#: what a drafter may use of its target context; everything else stays with the controller
_VIEW_ATTRS = frozenset({
    "model", "n_vocab", "n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max", "n_rollback",
    "n_threads", "is_mtp", "mtp_hidden", "lazy_logits", "logits", "prepare_logits",
    "mtp_hidden_row", "mtp_hidden_rows", "layer_inputs", "layer_input_rows", "seq_pos_min", "seq_pos_max", "tokenize", "detokenize",
})


cdef class TargetView:
    """The target context as a drafter sees it: model facts, the last decode's outputs and
    the sequences' positions, read only.

    The controller owns the target's memory: a drafter that removed or cleared positions, or
    decoded into it, would change the output speculative decoding promises to keep. Built-in
    drafters reach the context itself at C level (``Drafter._target``)."""

    def __init__(self, Context ctx not None):
        if self._ctx is not None:
            raise RuntimeError("a TargetView stays on the context it was made for")
        self._ctx = ctx

    def __repr__(self):
        return f"TargetView({self._ctx!r})"

    def __getattr__(self, name):
        if name in _VIEW_ATTRS:
            return getattr(self._ctx, name)
        if hasattr(Context, name) and not name.startswith("__"):
            raise AttributeError(f"drafters see the target read-only: Context.{name} is not "
                                 "available to them (the controller owns the target's memory)")
        raise AttributeError(f"'TargetView' object has no attribute {name!r}")

    def __dir__(self):
        return sorted(_VIEW_ATTRS)

    def tokenize(self, text, **kw) -> list:
        return self._ctx.model.tokenize(text, **kw)

    def detokenize(self, tokens, **kw) -> str:
        return self._ctx.model.detokenize(tokens, **kw)
