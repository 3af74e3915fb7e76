# cython: language_level=3
# distutils: language = c++
"""Drafts from a model with another tokenizer: its tokens become text, the text becomes the
target's tokens (HF's universal assisted decoding; vLLM/SGLang map shared ids instead).

The draft model drafts in its own vocabulary; the target verifies target tokens, so
acceptance and rollback never leave the target's vocabulary and greedy output stays the
target's. Two ways, picked once at load (:func:`translation`):

* ``"ids"``: the vocabularies hold the same ordinary tokens and differ only by padding,
  added or renumbered specials (vLLM #7252). A table built at load maps ids both ways;
  a draft id the target lacks ends the draft (it is refused, not proposed).
* ``"text"``: anything else whose text both tokenizers spell the same. The target's
  history is kept as text and the draft context is that text in draft tokens: after each
  round only a short window at the end is tokenized again, the common prefix of the
  draft context is kept and the rest decoded. The draft's text is tokenized by the
  target; a trailing token that more text could still lengthen (its text is a proper
  prefix of another token's), a trailing partial UTF-8 character and anything that does
  not spell the draft's text back are not proposed.
"""
from libc.stdint cimport int32_t
from libc.string cimport memcmp
from libcpp.string cimport string
from libcpp.vector cimport vector

from .._core cimport Model
from ._base cimport Draft

import numpy as np


cdef size_t _utf8_end(const string & s, size_t start) noexcept:
    """The end of ``s`` without a trailing incomplete UTF-8 character (not before start)."""
    cdef size_t n = s.size(), j = n
    cdef int k = 0, need
    cdef unsigned char c
    while j > start and k < 4:
        c = <unsigned char> s[j - 1]
        if c & 0xC0 != 0x80:            # a lead byte (or ASCII)
            need = 1 if c < 0x80 else 2 if c >> 5 == 6 else 3 if c >> 4 == 14 else 4 if c >> 3 == 30 else 1
            return j - 1 if need > k + 1 else n
        j -= 1
        k += 1
    return n


cdef class Translation:
    """Maps the target's history to the draft context's tokens and the draft's tokens to
    target tokens. The drafter (draft_model.pyx) decodes; this keeps the bookkeeping."""

    def __init__(self, Model target not None, Model draft not None):
        self.target = target
        self.draft = draft

    cdef int bind(self, int n_seq) except -1:
        self.ctx.clear()
        self.ctx.resize(n_seq)
        return 0

    cdef int begin(self, int seq) except -1:
        self.ctx[seq].clear()
        return 0

    cdef vector[int32_t] * observe(self, int seq, const int32_t * toks, int n) except NULL:
        """Target tokens entered the target: the draft tokens the draft context should hold."""
        raise NotImplementedError

    cdef vector[int32_t] * context(self, int seq, int32_t last) except NULL:
        """The draft tokens to hold before drafting what follows ``last`` (not yet observed)."""
        raise NotImplementedError

    cdef int budget(self, int n_max) noexcept:
        """Draft tokens to decode at most for a draft of ``n_max`` target tokens."""
        return n_max

    cdef int draft_start(self, int seq) except -1:
        self.out.clear()
        self.eog = False
        return 0

    cdef int draft_add(self, int32_t y) except -2:
        """The draft model's next token: how many target tokens the draft now has, or -1
        when it must stop here."""
        raise NotImplementedError

    cdef int draft_finish(self, Draft out, int n_max) except -1:
        cdef int i
        for i in range(min(n_max, <int>self.out.size())):
            out.tokens.push_back(self.out[i])
        return 0


def _texts(Model m):
    return [m.token_text(i) for i in range(m.n_vocab)]


def _ordinary(Model m, texts):
    """Texts of the tokens that are not control tokens (what plain text tokenizes to)."""
    return {t for i, t in enumerate(texts) if not m.is_control(i)}


cdef class IdTranslation(Translation):
    """Same ordinary tokens under other ids: a table each way, built once."""

    def __init__(self, Model target not None, Model draft not None):
        super().__init__(target, draft)
        self.mode = "ids"
        ttexts, dtexts = _texts(target), _texts(draft)
        t_by_text, d_by_text = {}, {}
        for i, t in enumerate(ttexts):
            t_by_text.setdefault(t, i)
        for i, t in enumerate(dtexts):
            d_by_text.setdefault(t, i)
        d2t = [t_by_text.get(t, -1) for t in dtexts]
        # end of generation maps to end of generation, whatever the two call it
        for i in range(draft.n_vocab):
            if d2t[i] < 0 and draft.is_eog(i) and target.eos >= 0:
                d2t[i] = target.eos
        if draft.eos >= 0 and target.eos >= 0:
            d2t[draft.eos] = target.eos
        if not any(d2t[i] >= 0 for i in range(draft.n_vocab) if not draft.is_control(i)):
            raise ValueError("no ordinary draft token has a target token of the same text")
        self.d2t = d2t
        self.t2d_off.push_back(0)
        for i, t in enumerate(ttexts):
            if i == target.bos:
                ids = [draft.bos] if draft.bos >= 0 else []
            elif i == target.eos and draft.eos >= 0:
                ids = [draft.eos]
            elif t in d_by_text:
                ids = [d_by_text[t]]
            elif target.is_control(i):
                ids = []
            else:   # a target token the draft lacks: its text in draft tokens
                ids = draft.tokenize(target.token_to_piece(i), add_special=False)
            for x in ids:
                self.t2d_ids.push_back(x)
            self.t2d_off.push_back(self.t2d_ids.size())

    cdef int bind(self, int n_seq) except -1:
        Translation.bind(self, n_seq)
        self.n_done.assign(n_seq, 0)
        return 0

    cdef int begin(self, int seq) except -1:
        Translation.begin(self, seq)
        self.n_done[seq] = 0
        return 0

    cdef int _append(self, int seq, int32_t t) except -1:
        cdef int j
        for j in range(self.t2d_off[t], self.t2d_off[t + 1]):
            self.ctx[seq].push_back(self.t2d_ids[j])
        return 0

    cdef vector[int32_t] * observe(self, int seq, const int32_t * toks, int n) except NULL:
        cdef int i
        self.ctx[seq].resize(self.n_done[seq])
        for i in range(n):
            self._append(seq, toks[i])
        self.n_done[seq] = self.ctx[seq].size()
        return &self.ctx[seq]

    cdef vector[int32_t] * context(self, int seq, int32_t last) except NULL:
        self.ctx[seq].resize(self.n_done[seq])
        self._append(seq, last)
        return &self.ctx[seq]

    cdef int draft_add(self, int32_t y) except -2:
        cdef int32_t t = self.d2t[y]
        if t < 0:
            return -1
        self.out.push_back(t)
        if self.draft.is_eog_c(y):
            self.eog = True
        return self.out.size()


cdef _pieces(Model m, int32_t skip, string & data, vector[int32_t] & off):
    """Every token's text (control tokens spelt out), concatenated; ``skip`` gets none."""
    off.clear()
    off.push_back(0)
    data.clear()
    cdef bytes b
    for i in range(m.n_vocab):
        b = b"" if i == skip else m.token_to_piece(i, special=bool(m.is_control(i)))
        data.append(<const char *> b, len(b))
        off.push_back(data.size())


cdef class TextTranslation(Translation):
    """Through text: the target's history re-tokenized for the draft, the draft's text
    tokenized for the target."""

    def __init__(self, Model target not None, Model draft not None, *, int window=4):
        super().__init__(target, draft)
        self.mode = "text"
        self.window = window
        self.t_bos = target.bos
        self.t_eos = target.eos
        self.d_bos = draft.bos if draft.add_bos else -1
        _pieces(target, target.bos, self.tpiece, self.tpiece_off)
        _pieces(draft, -1, self.dpiece, self.dpiece_off)
        self.d_control = [bool(draft.is_control(i)) for i in range(draft.n_vocab)]
        texts = [target.token_to_piece(i) if not target.is_control(i) else b""
                 for i in range(target.n_vocab)]
        prefixes = set()
        for t in texts:
            for k in range(1, len(t)):
                prefixes.add(t[:k])
        self.t_extends = [bool(t) and t in prefixes for t in texts]
        _check_round_trip(target, draft)

    cdef int bind(self, int n_seq) except -1:
        Translation.bind(self, n_seq)
        self.text.clear()
        self.text.resize(n_seq)
        self.covered.clear()
        self.covered.resize(n_seq)
        self.ends.clear()
        self.ends.resize(n_seq)
        self.n_sure.assign(n_seq, 0)
        return 0

    cdef int begin(self, int seq) except -1:
        Translation.begin(self, seq)
        self.text[seq].clear()
        self.covered[seq].clear()
        self.ends[seq].clear()
        self.n_sure[seq] = 0
        if self.d_bos >= 0:
            self.ctx[seq].push_back(self.d_bos)
            self.ends[seq].push_back(0)
        return 0

    cdef int budget(self, int n_max) noexcept:
        return 2 * n_max + 2

    cdef int _sync(self, int seq, const string & full) except -1:
        """Make ctx[seq] the draft tokens of ``full`` (up to its last whole character),
        tokenizing again only from a few tokens before where it differs from before."""
        cdef string * cov = &self.covered[seq]
        cdef vector[int32_t] * toks = &self.ctx[seq]
        cdef vector[int32_t] * ends = &self.ends[seq]
        cdef size_t e = _utf8_end(full, 0)
        cdef size_t p = min(<size_t> self.n_sure[seq], min(e, cov.size()))
        cdef size_t lim = min(e, cov.size())
        while p < lim and cov[0][p] == full[p]:
            p += 1
        cdef int nf = 1 if self.d_bos >= 0 else 0
        cdef int j = toks.size()
        while j > nf and ends[0][j - 1] > <int32_t> p:
            j -= 1
        j = max(nf, j - self.window)
        cdef size_t start = ends[0][j - 1] if j > nf else 0
        toks.resize(j)
        ends.resize(j)
        cov.assign(full, 0, e)
        if start >= e:
            return 0
        self.draft.tokenize_c(full.data() + start, e - start, True, self.scratch)
        cdef size_t pos = start
        cdef int32_t d, a, b
        cdef bint ok = True
        for d in self.scratch:
            a, b = self.dpiece_off[d], self.dpiece_off[d + 1]
            if ok and pos + (b - a) <= e and memcmp(full.data() + pos, self.dpiece.data() + a, b - a) == 0:
                pos += b - a
            else:
                ok = False     # the draft spells the text otherwise: one block up to e
                pos = e
            toks.push_back(d)
            ends.push_back(pos)
        if ok and pos != e and ends.size():
            ends[0][ends.size() - 1] = e
        return 0

    cdef int _add_text(self, int seq, const int32_t * toks, int n, string & dst) except -1:
        cdef int i
        for i in range(n):
            dst.append(self.tpiece.data() + self.tpiece_off[toks[i]],
                       self.tpiece_off[toks[i] + 1] - self.tpiece_off[toks[i]])
        return 0

    cdef vector[int32_t] * observe(self, int seq, const int32_t * toks, int n) except NULL:
        self._add_text(seq, toks, n, self.text[seq])
        self._sync(seq, self.text[seq])
        self.n_sure[seq] = self.covered[seq].size()
        return &self.ctx[seq]

    cdef vector[int32_t] * context(self, int seq, int32_t last) except NULL:
        cdef string full = self.text[seq]
        self._add_text(seq, &last, 1, full)
        self._sync(seq, full)
        self.pending = full.substr(self.covered[seq].size())
        return &self.ctx[seq]

    cdef int draft_start(self, int seq) except -1:
        Translation.draft_start(self, seq)
        self.dtext.clear()
        self.ttoks.clear()
        self.n_final = 0
        return 0

    cdef int draft_add(self, int32_t y) except -2:
        if self.pending.size():
            return -1    # the target's text ends inside a character: no draft this round
        if self.d_control[y]:
            if self.draft.is_eog_c(y):
                self.eog = True
                return self.out.size()
            return -1
        self.dtext.append(self.dpiece.data() + self.dpiece_off[y],
                          self.dpiece_off[y + 1] - self.dpiece_off[y])
        cdef size_t e = _utf8_end(self.dtext, 0), pos = 0
        self.out.clear()
        self.n_final = 0
        if e == 0:
            return 0
        self.target.tokenize_c(self.dtext.data(), e, False, self.ttoks)
        cdef int m = 0
        cdef int32_t t, a, b
        for t in self.ttoks:
            a, b = self.tpiece_off[t], self.tpiece_off[t + 1]
            if b == a or pos + (b - a) > e or memcmp(self.dtext.data() + pos, self.tpiece.data() + a, b - a):
                break
            pos += b - a
            m += 1
        # what ends the text may still grow into a longer token
        self.n_final = m if pos == self.dtext.size() else 0
        if m and pos == e and self.t_extends[self.ttoks[m - 1]]:
            m -= 1
        self.out.assign(self.ttoks.begin(), self.ttoks.begin() + m)
        return m

    cdef int draft_finish(self, Draft out, int n_max) except -1:
        cdef int i, n
        if not self.eog or self.n_final == 0:
            return Translation.draft_finish(self, out, n_max)
        # the draft's text ends here: its last token is final, then the target's end
        n = min(n_max, self.n_final)
        for i in range(n):
            out.tokens.push_back(self.ttoks[i])
        if n < n_max and self.t_eos >= 0:
            out.tokens.push_back(self.t_eos)
        return 0


def _spelt(Model m, bytes text) -> bytes:
    return b"".join(m.token_to_piece(t) for t in m.tokenize(text, add_special=False))


def _sample_text(Model src, int n=96) -> bytes:
    """Text of ``n`` ordinary tokens spread over ``src``'s vocabulary (printable UTF-8)."""
    out = []
    for i in np.unique(np.linspace(0, src.n_vocab - 1, 4 * n).astype(int)).tolist():
        if src.is_control(i):
            continue
        p = src.token_to_piece(i)
        try:
            ok = p.decode("utf-8").isprintable()
        except UnicodeDecodeError:
            continue
        if p and ok:
            out.append(p)
        if len(out) == n:
            break
    return b"".join(out)


def _check_round_trip(Model target, Model draft):
    """Both tokenizers must spell each other's text back, or translation cannot work."""
    for src, dst in ((target, draft), (draft, target)):
        text = _sample_text(src)
        got = _spelt(dst, text)
        if not text or got not in (text, b" " + text):
            raise ValueError(
                f"the draft model's tokenizer and the target's do not spell the same text "
                f"({_name(src)}'s {text[:40]!r} comes back from {_name(dst)} as {got[:40]!r}), "
                f"so drafts cannot be translated between them")


def _name(Model m) -> str:
    import os
    return os.path.basename(m.path)


def translation(Model target not None, Model draft not None, str mode="auto") -> Translation:
    """The translation from ``draft``'s vocabulary to ``target``'s: ``"ids"`` when both hold
    the same ordinary tokens (padding, specials and numbering aside), else ``"text"``;
    ``mode`` forces one. ValueError when the two cannot be translated."""
    if mode not in ("auto", "ids", "text"):
        raise ValueError(f"translation mode must be 'auto', 'ids' or 'text', got {mode!r}")
    if mode == "auto":
        same = _ordinary(target, _texts(target)) == _ordinary(draft, _texts(draft))
        mode = "ids" if same else "text"
    if mode == "ids":
        return IdTranslation(target, draft)
    return TextTranslation(target, draft)
