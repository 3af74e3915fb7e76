# cython: language_level=3
# distutils: language = c++
"""A request's grammar during the round: it masks verify rows and shapes drafts.

The constraint engine is llguidance (``LLMatcher``; compiled by ``specdec.constraint``).
Its state follows the request's output: after ``last`` it gives the mask of verify row 0,
after ``last, d1..di`` the mask of row ``i``. The verifier asks for one row's mask at a
time (``bits_c``: one call into llguidance, which writes the bitmask into a preallocated
buffer), before the row's logits: a row that allows few tokens gets only their logits
from the lazy LM head (``Context.masked_logits_c``), others are masked in full
(``apply_c``: the logits outside the mask are set to -inf, without the GIL); and it
advances the state by each token it keeps (``advance_c``); a rejected draft never
entered the state, so nothing is rolled back after a verify. Greedy verification then
takes the masked argmax, and sampled verification draws from the masked, renormalised
distribution: the output is what plain constrained decoding gives, token for token in
exact mode.

Before a draft costs verify rows, ``fit_draft_c`` shapes it: the tokens the grammar
forces from here (llguidance's fast-forward tokens: JSON keys and punctuation, a
choice's fixed prefix) lead it, whatever the drafter proposed, and the draft is cut at
its first token the grammar refuses. Forced tokens are verified like any draft, so the
output law is unchanged; the target's masked choice there is the forced text, so they
are accepted unless the target prefers another tokenization of the same bytes.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, uint32_t
from libc.string cimport memcpy

from ._llama cimport sd_mask_count
from .drafters._base cimport Draft


cdef class GrammarState:
    """GrammarState(matcher, n_vocab, eos)
--

    One request's grammar state (``matcher``: a fresh ``llguidance.LLMatcher``; ``eos``:
    the token allowed alone if the matcher fails mid-request, which ends the request).
    Built by ``specdec.constraint.Grammar.state``."""

    def __init__(self, matcher, int n_vocab, int eos):
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.bits.resize((n_vocab + 31) // 32)
        self.eos = eos
        self.error = None

    cdef const uint32_t * bits_c(self) except NULL:
        """The mask of the next token (a bit per token id, set: allowed): one call into
        llguidance, which writes it into a preallocated buffer; asked again before the state
        moves (a lockstep verification classes a row by its mask, then reads the row), the
        same buffer."""
        cdef uint32_t * w = self.bits.data()
        cdef const uint32_t * src
        cdef size_t nbytes = self.bits.size() * 4
        if self.fresh:
            return w
        if self.ahead_at > 0:
            # computed by ``whole_ahead`` for this very state (the path the state went on by)
            src = &self.ahead[<size_t>(self.ahead_at - 1) * self.bits.size()]
            memcpy(w, src, nbytes)
            self.n_reused += 1
        else:
            self.matcher.unsafe_compute_mask_ptr(<size_t> w, nbytes)
        self.fresh = True
        self.n_masks += 1
        if self.error is None and self.matcher.is_error():
            # llguidance failed here (a lexer or parser limit, or no output can match: an
            # empty class): its mask allows the end of text alone, which ends the request;
            # the error is kept, so that the output is not taken for a match
            self.error = _first_line(self.matcher.get_error()) or "the grammar failed"
        if _none_set(w, self.bits.size(), self.n_vocab):
            # the matcher failed (a parser limit) or reached a dead end: end the request
            if self.error is None:
                self.error = _first_line(self.matcher.get_error()) or "the grammar allows no token here"
            _set_only(w, self.bits.size(), self.eos)
        return w

    def check_start(self) -> None:
        """A ``ValueError`` where no output can match (a regex of an empty class, a schema
        that refers only to itself): the mask of the first token, computed here once and
        kept for the first row, is llguidance's error state."""
        self.bits_c()
        if self.error is not None:
            raise ValueError(f"no output can match this constraint: {self.error}")

    cdef void apply_c(self, float * logits) noexcept nogil:
        """Tokens the last mask (``bits_c``) refuses get -inf in ``logits`` (one row)."""
        _apply(self.bits.data(), logits, self.n_vocab)

    cdef int mask_c(self, float * logits) except -1:
        """Mask ``logits`` (one row) by the grammar state: tokens it refuses get -inf."""
        self.bits_c()
        with nogil:
            self.apply_c(logits)
        return 0

    cdef int whole_ahead(self, const int32_t * toks, int n, int sparse_head) except -1:
        """How many rows after the next one need the whole head too, in a row: the grammar
        taken on through ``toks[0..i]`` (the drafts), row ``i + 1``'s mask allows more than
        ``n_vocab / sparse_head`` tokens (0: every row is whole). The count stops at the first
        row that allows fewer, or at a token the grammar refuses; the state is put back (the
        masks go to ``ahead``, ``bits`` stays the next row's). The masks are kept with the
        tokens they follow: as the verification keeps those tokens (``advance_c``), each
        row's mask is read from them, not computed a second time."""
        cdef int i, c = 0, taken = 0
        if n <= 0 or self.error is not None:
            return 0
        if sparse_head <= 0:
            return n
        cdef size_t words = self.bits.size()
        if self.ahead.size() < <size_t>n * words:
            self.ahead.resize(<size_t>n * words)
        cdef size_t nbytes = words * 4
        cdef uint32_t * w
        self.ahead_path.clear()
        self.ahead_at = 0
        try:
            for i in range(n):
                if self.matcher.try_consume_tokens([toks[i]]) != 1:
                    break
                taken += 1
                w = self.ahead.data() + <size_t>i * words
                self.matcher.unsafe_compute_mask_ptr(<size_t> w, nbytes)
                self.ahead_path.push_back(toks[i])
                self.n_ahead += 1
                if sd_mask_count(w, self.n_vocab) * sparse_head <= self.n_vocab:
                    break
                c += 1
        finally:
            if taken:
                self.matcher.rollback(taken)
        return c

    cdef bint allowed_c(self, int32_t tok) noexcept nogil:
        """Whether the last mask allows ``tok``."""
        return (self.bits[tok >> 5] >> (tok & 31)) & 1

    cdef int advance_c(self, int32_t tok) except -1:
        """The request's output goes on with ``tok`` (allowed by the last mask)."""
        self.fresh = False
        self.forced_known = False
        if self.error is None and not self.matcher.consume_token(tok):
            self.error = _first_line(self.matcher.get_error()) or f"the grammar refused token {tok}"
        if (self.error is None and self.ahead_at < <int>self.ahead_path.size()
                and self.ahead_path[self.ahead_at] == tok):
            self.ahead_at += 1         # the next mask is the one computed ahead on this path
        else:
            self.ahead_path.clear()
            self.ahead_at = 0
        return 0

    cdef const vector[int32_t] * forced_c(self) except NULL:
        """The tokens the grammar forces from its state now (computed once per state: the
        round's drafting asks before the drafters, to give them as context, and after)."""
        if not self.forced_known:
            self.forced.clear()
            if self.error is None:
                for t in self.matcher.compute_ff_tokens():
                    self.forced.push_back(t)
            self.forced_known = True
        return &self.forced

    cdef int fit_draft_c(self, Draft draft, int k_cap) except -1:
        """Forced tokens first, then what the grammar allows of the draft; returns how many
        tokens lead it that the grammar forces. A draft that does not begin with them is
        replaced by them (its continuation would follow other tokens); one that does (a
        drafter given them as context drafts past them) is cut at the grammar's first refusal."""
        self.replaced = False
        if self.error is not None or k_cap <= 0:
            draft.clear()
            return 0
        cdef const vector[int32_t] * forced = self.forced_c()
        cdef int n_f = min(<int>forced.size(), k_cap), i, n = draft.tokens.size()
        cdef bint keep = n >= n_f
        for i in range(min(n, n_f)):
            if draft.tokens[i] != forced[0][i]:
                keep = False
                break
        if not keep:
            self.replaced = n > 0
            draft.clear()
            for i in range(n_f):
                draft.tokens.push_back(forced[0][i])
            self.n_forced += n_f
            return n_f
        n = min(n, k_cap)
        if n > n_f:
            n_ok = self.matcher.validate_tokens([draft.tokens[i] for i in range(n)])
            self.n_cut += n - n_ok
            n = n_ok
            if n_f > 0 and n > n_f:
                self.n_after_forced += n - n_f
        draft.tokens.resize(n)
        self.n_forced += n_f
        return n_f

    # Python access, for tests
    def mask(self, logits):
        """Mask a float32 row in place (as a verify row is) and return it."""
        import numpy as np
        if not isinstance(logits, np.ndarray) or logits.dtype != np.float32 \
                or logits.shape != (self.n_vocab,) or not logits.flags.c_contiguous:
            raise ValueError(f"logits must be a contiguous float32 array of {self.n_vocab}")
        cdef float[::1] v = logits
        self.mask_c(&v[0])
        return logits

    def look_ahead(self, tokens, int sparse_head) -> int:
        """``whole_ahead`` over ``tokens`` from the state now (its masks kept for the rows
        that follow them)."""
        cdef vector[int32_t] t = [int(x) for x in tokens]
        self.bits_c()
        return self.whole_ahead(t.data(), <int>t.size(), sparse_head)

    def advance(self, int tok) -> None:
        if not 0 <= tok < self.n_vocab:
            raise ValueError(f"token id {tok} out of range [0, {self.n_vocab})")
        self.advance_c(tok)

    def fit_draft(self, tokens, int k_cap):
        """``(draft tokens, n_forced)`` for a proposal ``tokens`` (see ``fit_draft_c``)."""
        cdef Draft d = Draft()
        for t in tokens:
            d.tokens.push_back(t)
        n_f = self.fit_draft_c(d, k_cap)
        return d.token_list, n_f

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()


def _first_line(message) -> str:
    """llguidance's error without the parser state it dumps after the first line."""
    return (message or "").split("\n", 1)[0].strip()


cdef bint _none_set(const uint32_t * w, size_t n_words, int n_vocab) noexcept:
    cdef size_t j, full = n_vocab // 32
    for j in range(full):
        if w[j] != 0:
            return False
    if full < n_words and (w[full] & ((<uint32_t>1 << (n_vocab & 31)) - 1)) != 0:
        return False
    return True


cdef void _set_only(uint32_t * w, size_t n_words, int32_t tok) noexcept:
    cdef size_t j
    for j in range(n_words):
        w[j] = 0
    w[tok >> 5] = <uint32_t>1 << (tok & 31)


cdef void _apply(const uint32_t * w, float * logits, int n_vocab) noexcept nogil:
    cdef int j, b, base, n_words = (n_vocab + 31) // 32
    cdef uint32_t x
    for j in range(n_words):
        x = w[j]
        if x == <uint32_t>0xFFFFFFFF:
            continue
        base = j * 32
        if x == 0 and base + 32 <= n_vocab:
            for b in range(32):
                logits[base + b] = -INFINITY
            continue
        for b in range(32):
            if base + b < n_vocab and not (x >> b) & 1:
                logits[base + b] = -INFINITY
