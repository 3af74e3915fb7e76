# cython: language_level=3
# distutils: language = c++
"""Penalties and ``logit_bias``: a transform of one verify row's logits, by its history.

A penalty makes the target's distribution depend on the tokens before the row, so under
speculation each verify row is transformed with the history up to that row: the request's
output so far plus the draft tokens before the row (``before``). Greedy verification then
keeps exactly the tokens plain decoding with the same penalties would, and rejection
sampling samples exactly the penalised distribution.

The transform, in vLLM's order and with its meanings: ``logit_bias`` added; the
repetition penalty (HF's / vLLM's: a token of the prompt or the output has a positive logit
divided by it, a negative one multiplied); then ``presence`` subtracted from a token that
appears in the output, and ``frequency`` times its count (OpenAI's). It is applied in place
before argmax or the sampling distribution is built and undone right after
(:meth:`Penalty.restore`), so logprobs and checks still read the raw logits. It touches only
the tokens of the prompt, the output, the draft and the bias: no pass over the vocabulary.
"""
from libc.stdint cimport int32_t
from libcpp.vector cimport vector


cdef class Penalty:
    """Penalty(n_vocab, prompt, *, repetition=1.0, presence=0.0, frequency=0.0, logit_bias=())

    One request's penalties and bias; ``active`` is False when they change nothing (the
    controller then skips them)."""

    def __init__(self, int n_vocab, prompt=(), *, float repetition=1.0, float presence=0.0,
                 float frequency=0.0, logit_bias=()):
        cdef int32_t t
        self.n_vocab = n_vocab
        self.repetition = repetition
        self.presence = presence
        self.frequency = frequency
        bias = list(logit_bias)
        self.active = repetition != 1.0 or presence != 0.0 or frequency != 0.0 or bool(bias)
        if not self.active:
            return
        self.count.assign(n_vocab, 0)
        self.saved.assign(n_vocab, 0)
        if repetition != 1.0:
            self.in_prompt.assign(n_vocab, 0)
            for t in prompt:
                assert 0 <= t < n_vocab
                if not self.in_prompt[t]:
                    self.in_prompt[t] = 1
                    self.prompt_ids.push_back(t)
        if bias:
            self.bias.assign(n_vocab, 0.0)
            for t, b in bias:
                assert 0 <= t < n_vocab
                if self.bias[t] == 0.0:
                    self.bias_ids.push_back(t)
                self.bias[t] = b

    cdef void push(self, int32_t tok) noexcept nogil:
        """``tok`` joins the output (the history of every later row)."""
        if not self.active:
            return
        if self.count[tok] == 0:
            self.out_ids.push_back(tok)
        self.count[tok] += 1

    cdef void _one(self, float * logits, int32_t t) noexcept nogil:
        if self.saved[t]:
            return
        self.saved[t] = 1
        self.saved_ids.push_back(t)
        cdef float v = logits[t]
        self.saved_vals.push_back(v)
        cdef int32_t c = self.count[t]
        if not self.bias.empty():
            v += self.bias[t]
        if self.repetition != 1.0 and (c > 0 or (not self.in_prompt.empty() and self.in_prompt[t])):
            v = v / self.repetition if v > 0 else v * self.repetition
        if c > 0:
            v -= self.presence + self.frequency * c
        logits[t] = v

    cdef void apply(self, float * logits, const int32_t * before, int n_before) noexcept nogil:
        """Transform ``logits`` (one row) for the history: the output, then ``before``."""
        cdef int i
        cdef size_t j
        if not self.active:
            return
        for i in range(n_before):
            self.count[before[i]] += 1
        for i in range(n_before):
            self._one(logits, before[i])
        for j in range(self.out_ids.size()):
            self._one(logits, self.out_ids[j])
        for j in range(self.prompt_ids.size()):
            self._one(logits, self.prompt_ids[j])
        for j in range(self.bias_ids.size()):
            self._one(logits, self.bias_ids[j])
        for i in range(n_before):
            self.count[before[i]] -= 1

    cdef void restore(self, float * logits) noexcept nogil:
        """Put back the raw logits :meth:`apply` changed."""
        cdef size_t j
        for j in range(self.saved_ids.size()):
            logits[self.saved_ids[j]] = self.saved_vals[j]
            self.saved[self.saved_ids[j]] = 0
        self.saved_ids.clear()
        self.saved_vals.clear()

    # Python access, for tests
    def push_py(self, int tok) -> None:
        if not 0 <= tok < self.n_vocab:
            raise ValueError(f"token {tok} out of range [0, {self.n_vocab})")
        self.push(tok)

    def transform(self, logits, before=()):
        """The transformed copy of ``logits`` (1-D float32) for this history plus ``before``."""
        import numpy as np
        cdef float[::1] out = np.array(logits, dtype=np.float32)
        cdef vector[int32_t] b
        if out.shape[0] != self.n_vocab:
            raise ValueError(f"logits must have {self.n_vocab} entries, got {out.shape[0]}")
        for t in before:
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"token {t} out of range [0, {self.n_vocab})")
            b.push_back(t)
        self.apply(&out[0], b.data(), b.size())
        res = np.array(out)
        self.restore(&out[0])
        return res

    @property
    def is_active(self) -> bool:
        return self.active
