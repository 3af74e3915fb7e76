# cython: language_level=3
# distutils: language = c++
"""What one sequence emits: tokens, their text, stop strings, and (when asked) logprobs.

The controller pushes each accepted token; ``TextOutput`` decides whether the sequence
is finished (end-of-generation token, a stop string, ``max_tokens``) and cuts the text
at a stop string. ``take`` releases what can no longer change: text that could still
turn out to be the start of a stop string is held back until it cannot.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int32_t
from libcpp.string cimport string

from ._core cimport Model
from ._logprobs cimport token_logprobs

_FINISH = {RUNNING: None, STOP_EOG: "eos", STOP_STRING: "stop", LENGTH: "length",
           CTX_FULL: "context", FAILED: "error"}


cdef class TextOutput:
    """TextOutput(model, max_tokens, stops=(), n_top=-1, stop_ids=())
--

    ``stops``: checked, non-empty UTF-8 byte strings (the API validates them).
    ``n_top``: -1 keeps no logprobs; 0 keeps the chosen token's; k > 0 also the k best.
    ``stop_ids``: token ids that end the sequence like an end-of-generation token (left out
    of the output), finishing it with "stop"."""

    def __init__(self, Model model not None, int max_tokens, stops=(), int n_top=-1,
                 stop_ids=()):
        assert max_tokens > 0, "max_tokens is checked by the API"
        self.model = model
        self.max_tokens = max_tokens
        self.n_top = n_top
        for s in stops:
            assert isinstance(s, bytes) and s, "stop strings are checked by the API"
            self.stops.push_back(s)
        for t in stop_ids:
            assert 0 <= t < model.n_vocab, "stop token ids are checked by the API"
            self.stop_ids.push_back(t)

    cdef bint push(self, int32_t tok, const float * logits) except -1:
        """Append one token; True when the sequence is finished.

        ``logits``: the row the token was chosen from (for logprobs; NULL when none
        are kept). A stop string cuts the text where it begins, and the tokens that lie
        wholly at or after that point are dropped: ``tokens`` ends with the token in
        which the stop string begins (whose text may run past ``text``), or before it
        when it begins exactly at a token boundary.
        """
        cdef char buf[256]
        cdef int n, start
        cdef size_t pos, from_, i, n_keep, first
        if self.model.is_eog_c(tok):
            self.finish = STOP_EOG
            return True
        for i in range(self.stop_ids.size()):
            if self.stop_ids[i] == tok:
                self.finish = STOP_STRING
                return True
        if self.n_top >= 0 and logits != NULL:
            n = self.top_ids.size()
            self.top_ids.resize(n + self.n_top)
            self.top_lp.resize(n + self.n_top)
            self.lp.push_back(token_logprobs(logits, self.model.n_vocab, tok, self.n_top,
                                             self.top_ids.data() + n, self.top_lp.data() + n))
        self.tokens.push_back(tok)
        n = self.model.piece_c(tok, buf, sizeof(buf))
        if n > 0:
            self.text.append(buf, n)
        self.ends.push_back(self.text.size())
        if n > 0:
            # of the stop strings this token completes, the one that begins first cuts the
            # text (not the first listed: stop=["5", "6"] on "65" gave "6", a stop string)
            first = <size_t>-1
            for i in range(self.stops.size()):
                start = <int>self.text.size() - n - <int>self.stops[i].size() + 1
                from_ = start if start > 0 else 0
                pos = self.text.find(self.stops[i], from_)
                if pos < first:      # npos, no match, is the largest size_t
                    first = pos
            if first != <size_t>-1:
                self.text.resize(first)
                n_keep = self.tokens.size()
                while n_keep > 0 and (self.ends[n_keep - 2] if n_keep >= 2 else 0) >= first:
                    n_keep -= 1
                self._truncate(n_keep)
                self.finish = STOP_STRING
                return True
        if <int>self.tokens.size() >= self.max_tokens:
            self.finish = LENGTH
            return True
        return False

    cdef void _truncate(self, size_t n) noexcept:
        self.tokens.resize(n)
        self.ends.resize(n)
        if self.lp.size() > n:
            self.lp.resize(n)
            self.top_ids.resize(n * self.n_top)
            self.top_lp.resize(n * self.n_top)

    cdef size_t _held(self) noexcept:
        """Bytes at the end of the text that could still begin a stop string."""
        cdef size_t hold = 0, n, m, i, L = self.text.size()
        for i in range(self.stops.size()):
            m = self.stops[i].size() - 1
            if m > L:
                m = L
            n = m
            while n > hold:
                if self.text.compare(L - n, n, self.stops[i], 0, n) == 0:
                    hold = n
                    break
                n -= 1
        return hold

    def set_finish(self, int reason):
        """End the sequence from outside (the controller: context full)."""
        self.finish = reason

    @property
    def finish_reason(self):
        return _FINISH[self.finish]

    @property
    def n_tokens(self) -> int:
        return self.tokens.size()

    def token_list(self) -> list:
        return [self.tokens[i] for i in range(self.tokens.size())]

    def text_bytes(self) -> bytes:
        return self.text

    def logprob_list(self, size_t i0=0, size_t i1=<size_t>-1) -> list:
        """``(logprob, [(id, logprob), ...])`` per token of ``tokens[i0:i1]`` (empty when none
        are kept). Alternatives of probability 0 are left out: under a grammar the row is the
        one its mask allows, and where it allows fewer tokens than ``n_top`` the rest of the
        list would be tokens it refused at -inf (the lowest ids), which no JSON can carry
        (the server answered a 500) and no client can read as an alternative."""
        cdef size_t i, j, k = self.n_top if self.n_top > 0 else 0
        if i1 > self.lp.size():
            i1 = self.lp.size()
        return [(self.lp[i], [(self.top_ids[i * k + j], self.top_lp[i * k + j]) for j in range(k)
                              if self.top_lp[i * k + j] > -INFINITY])
                for i in range(i0, i1)]

    def take(self):
        """``(text bytes, token ids, logprobs)`` released since the last call.

        Tokens and text are released together, a token once all of its text is safe
        from a stop string; a finished sequence releases everything it kept."""
        cdef size_t n0 = self.n_taken, n1, safe, t1
        if self.finish != RUNNING:
            n1 = self.tokens.size()
            t1 = self.text.size()
        else:
            safe = self.text.size() - self._held()
            n1 = n0
            while n1 < self.tokens.size() and self.ends[n1] <= safe:
                n1 += 1
            t1 = self.ends[n1 - 1] if n1 > 0 else 0
        if t1 < self.text_taken:
            t1 = self.text_taken
        cdef bytes b = self.text.substr(self.text_taken, t1 - self.text_taken)
        toks = [self.tokens[i] for i in range(n0, n1)]
        lps = self.logprob_list(n0, n1) if self.n_top >= 0 else None
        self.n_taken = n1
        self.text_taken = t1
        return b, toks, lps
