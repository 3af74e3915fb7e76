# cython: language_level=3
# distutils: language = c++
"""Log-probabilities of emitted tokens, from the verify rows' raw logits.

``log_softmax`` of the target's logits before any sampling filter (the model's own
distribution, as OpenAI's ``logprobs`` report it), for the chosen token and the
``n_top`` most likely ones. Only requests that ask for logprobs pay for it: one pass
over the vocabulary per emitted token. Under a grammar the row is masked first (refused
tokens at -inf): the logprobs are those of what its mask allows.
"""
from libc.math cimport exp, log
from libc.stdint cimport int32_t

import numpy as np


cdef float token_logprobs(const float * logits, int n_vocab, int32_t tok, int n_top,
                          int32_t * top_ids, float * top_lp) noexcept nogil:
    """The chosen token's logprob; the ``n_top`` best into ``top_ids``/``top_lp``, best first
    (ties: the lower id first)."""
    cdef int i, j, n = 0
    cdef float mx = logits[0], x
    for i in range(1, n_vocab):
        if logits[i] > mx:
            mx = logits[i]
    cdef double z = 0.0
    for i in range(n_vocab):
        z += exp(logits[i] - mx)
    cdef float lse = mx + <float>log(z)
    if n_top > 0:
        # insertion into a short sorted list: almost every logit fails the first comparison
        for i in range(n_vocab):
            x = logits[i]
            if n == n_top and x <= top_lp[n - 1]:
                continue
            j = n if n < n_top else n_top - 1
            while j > 0 and top_lp[j - 1] < x:
                top_lp[j] = top_lp[j - 1]
                top_ids[j] = top_ids[j - 1]
                j -= 1
            top_lp[j] = x
            top_ids[j] = i
            if n < n_top:
                n += 1
        for j in range(n):
            top_lp[j] = top_lp[j] - lse
    return logits[tok] - lse


def logprobs(logits, int token, int n_top=0):
    """``(logprob of token, [(id, logprob), ...] of the n_top best)`` for a logits row."""
    cdef float[::1] l = np.ascontiguousarray(logits, dtype=np.float32)
    if not 0 <= token < l.shape[0]:
        raise ValueError(f"token {token} out of range [0, {l.shape[0]})")
    if not 0 <= n_top <= l.shape[0]:
        raise ValueError(f"n_top must be in [0, {l.shape[0]}], got {n_top}")
    cdef int32_t[::1] ids = np.zeros(max(n_top, 1), dtype=np.int32)
    cdef float[::1] lps = np.zeros(max(n_top, 1), dtype=np.float32)
    cdef float lp = token_logprobs(&l[0], l.shape[0], token, n_top, &ids[0], &lps[0])
    return float(lp), [(int(ids[i]), float(lps[i])) for i in range(n_top)]
