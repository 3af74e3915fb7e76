# Part of _core (included by _core.pyx): the lazy LM head's part of a decode.
#
# With ``lazy_logits`` the decode graph stops at the final norm (``sd_lm_head_cb``) and the
# logits of an output row are computed when first read (_lm_head.h). That needs the outputs in
# batch order: one ubatch that llama.cpp's split_simple made (it keeps the order), which a
# single sequence always gets, and several get in one KV stream of an attention-only target
# (recurrent memory and KV streams per sequence split by sequence). Other decodes run the
# whole graph and llama.cpp's logits stand.


cdef inline void _lazy_head_begin(sd_lm_head * h, int n_tokens, int n_out, int n_ubatch,
                                  int n_seqs, bint multi, bint grammar) noexcept:
    """Before a decode: let it stop at the norm when the head runs (or, off, the decode holds
    a grammar's rows and ``h.grammar`` says to serve those, or it has at most ``h.upto``
    output rows) and the batch allows (``multi``: several sequences keep their batch order)."""
    h.active = ((h.enabled or (grammar and h.grammar) or (h.upto > 0 and n_out <= h.upto))
                and h.state == 1
                and n_tokens <= n_ubatch and (n_seqs == 1 or multi))
    sd_lm_head_begin(h)


cdef inline float * _lazy_head_logits(sd_lm_head * h, int r, int n_vocab) noexcept nogil:
    """The logits of output row ``r`` of a lazy decode, computed on first read."""
    if not h.done[r]:
        sd_lm_head_compute(h, r, r + 1)
    return h.logits.data() + <size_t>r * n_vocab


cdef int _lazy_head_finish(sd_lm_head * h, int n_outputs, int n_vocab) except -1:
    """After a decode: 1 if its logits come from the lazy head, 0 if llama.cpp's stand.

    The first decode finds the output weight; a head that cannot serve this model is turned
    off for good, with the reason in ``h.why``."""
    if sd_lm_head_wanted(h) and h.state == 1 and h.n_vocab != n_vocab:
        h.state = -1
        h.why = b"the output weight's rows are not the vocabulary"
    if not h.active:
        return 0
    # (a decode without outputs has nothing to read, whatever rows its norm had: the eagle3
    # decoder does not prune its rows to the outputs)
    if h.captured and (h.n_rows == n_outputs or n_outputs == 0):
        sd_lm_head_end(h)
        return 1
    h.state = -1
    if not h.captured:   # no result_norm node: the graph ran on, llama.cpp's logits stand
        h.why = b"the graph has no result_norm node"
        return 0
    # the graph stopped at the norm but its rows are not the outputs: nothing holds this
    # decode's logits (a batch of one ubatch and one sequence should never do this)
    h.why = b"result_norm rows differ from the outputs"
    raise DecodeError(f"lazy LM head: {h.n_rows} norm rows for {n_outputs} outputs; lazy "
                      "logits are now off, decode again")


cdef str _lazy_head_status(const sd_lm_head * h):
    if not h.enabled and h.upto <= 0:
        return "off"
    if h.state == 0:
        return "pending"
    if h.state == 1:
        return "on" if h.enabled else f"on up to {h.upto} rows"
    return "unavailable: " + h.why.decode()


cdef str _lazy_head_kernel(const sd_lm_head * h):
    if h.state != 1 or (h.is_q8_0 and h.fused == 0):
        return ""
    return "fused-q8_0" if h.is_q8_0 and h.fused == 1 else "vec_dot"
