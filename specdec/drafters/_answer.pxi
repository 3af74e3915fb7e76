# A Python drafter's answer, checked and copied into a Draft (included by _base.pyx: the
# contract's hooks call it, and tools check answers with check_draft).

cdef _fill_draft(Draft out, res, int n_max, int n_vocab, str name):
    """Check a Python drafter's answer and copy it into ``out``."""
    out.clear()
    probs = None
    if res is None:
        return
    if isinstance(res, tuple) and len(res) == 2 and not isinstance(res[0], numbers.Integral):
        res, probs = res
    if isinstance(res, (str, bytes)) or not hasattr(res, "__len__"):
        raise DrafterError(f"drafter {name!r} must return a sequence of token ids, "
                           f"got {type(res).__name__}")
    try:
        len(res)
        if probs is not None:
            len(probs)
    except TypeError as e:   # a 0-d array, an object with a broken __len__
        raise DrafterError(f"drafter {name!r} returned an unsized answer: {e}") from None
    if len(res) > n_max:
        raise DrafterError(f"drafter {name!r} returned {len(res)} tokens, more than n_max={n_max}")
    cdef int32_t t
    for x in res:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise DrafterError(f"drafter {name!r} returned a non-integer token {x!r}")
        if x < 0 or x >= n_vocab:
            raise DrafterError(f"drafter {name!r} returned token id {x} outside [0, {n_vocab})")
        t = x
        out.tokens.push_back(t)
    if probs is None:
        return
    if len(probs) != len(res):
        raise DrafterError(f"drafter {name!r} returned {len(probs)} distributions for "
                           f"{len(res)} tokens")
    cdef int i
    for i, q in enumerate(probs):
        if isinstance(q, dict):
            items = list(q.items())
        else:
            try:
                arr = np.asarray(q, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as e:
                raise DrafterError(f"drafter {name!r}: distribution {i} is not an array of "
                                   f"numbers: {e}") from None
            if arr.shape[0] != n_vocab:
                raise DrafterError(f"drafter {name!r}: distribution {i} has {arr.shape[0]} "
                                   f"entries, expected {n_vocab}")
            nz = np.flatnonzero(arr)
            items = list(zip(nz.tolist(), arr[nz].tolist()))
        total = 0.0
        for tok, p in items:
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral) or not 0 <= tok < n_vocab:
                raise DrafterError(f"drafter {name!r}: distribution {i} has bad token id {tok!r}")
            if not isinstance(p, numbers.Real) or not math.isfinite(p) or p < 0:
                raise DrafterError(f"drafter {name!r}: distribution {i} has probability {p!r}")
            total += p
        if not total > 0:
            raise DrafterError(f"drafter {name!r}: distribution {i} is all zero")
        for tok, p in items:
            if p > 0:
                out.q_ids.push_back(tok)
                out.q_probs.push_back(p / total)
        out.q_off.push_back(out.q_ids.size())
    out.has_probs = True
    # the draft token must have non-zero draft probability: it was drawn from q
    for i in range(<int>out.tokens.size()):
        found = False
        for j in range(out.q_off[i], out.q_off[i + 1]):
            if out.q_ids[j] == out.tokens[i]:
                found = True
                break
        if not found:
            raise DrafterError(f"drafter {name!r}: token {out.tokens[i]} at position {i} has "
                               "zero draft probability")


def check_draft(res, int n_max, int n_vocab, str name="drafter"):
    """Check a Python drafter's answer as the controller does; raises ``DrafterError``."""
    _fill_draft(Draft(), res, n_max, n_vocab, name)
