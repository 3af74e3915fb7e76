"""Structured output: what a request's text must match, declared once and compiled per request.

A request takes at most one of :class:`Constraint`'s fields (``grammar=``, ``json_schema=``,
``regex=``, ``choices=``, ``lark=``) on ``Decoder.generate/stream/chat``, ``Engine.submit/
generate/stream``, ``specdec generate`` and the server. The constraint engine is llguidance
(``pip install specdec[structured]``), which llama.cpp's ``LLAMA_LLGUIDANCE`` build and vLLM
use too: it compiles the constraint against the model's vocabulary here, when the request is
made (a bad grammar or schema is a ``ValueError`` then, never inside a round), and its
matcher masks each verify row in the round (``specdec._grammar``).
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from ._core import Model

#: how JSON is written under a schema: one space after ':' and ',' and no other whitespace
#: (a model cannot pad it without end, and the separators are forced tokens); a schema's
#: own ``x-guidance`` options override it. An object schema with ``properties`` and no
#: ``additionalProperties`` gets no other keys, as llama.cpp's converter has it (a pydantic
#: model's schema says nothing of them, and a model would go on inventing keys).
JSON_OPTIONS: Dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                                "key_separator": ": "}
#: the most rules (terminals included) a grammar may define. llguidance's compiler recurses
#: along chains of rules on the stack of the thread that builds the matcher, about 2.5 KB a
#: link: a GBNF chain of 5000 rules (``r0 ::= r1 | "a"`` ...) overflowed a main thread's 8 MB
#: and the process died of SIGSEGV; and llguidance's GBNF converter takes time quadratic in
#: the rules (about 3 s for 2000 on a shared 2-core machine, minutes for 20000)
MAX_GRAMMAR_RULES = 2000
#: the most choices (``choices=``): llguidance's parser holds at most 2000 items in a row
MAX_CHOICES = 1999
#: the stack of the thread that builds a matcher: MAX_GRAMMAR_RULES links a dozen times over,
#: whatever stack the caller's thread has
_BUILD_STACK = 64 << 20
#: a rule's or a terminal's definition in llguidance's Lark (``?name.2: ...``, ``NAME: ...``)
_LARK_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_]\w*(?:\.-?\d+)?[ \t]*(?:\{[^}\n]*\})?[ \t]*:",
                        re.M)


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: at most one field set.

    ``grammar``: GBNF, as llama.cpp writes it. ``json_schema``: a JSON schema (a dict, its
    JSON text, or a pydantic model class). ``regex``: a regular expression (Rust's syntax)
    the whole output matches. ``choices``: the output is one of these strings. ``lark``:
    llguidance's Lark dialect (it can embed JSON schemas: ``%json {...}``).
    """

    # metadata: what ``specdec generate`` takes (``cli``: a file's text, the text, or a
    # repeated option's list) and its help
    grammar: Optional[str] = field(default=None, metadata={"cli": "file", "help": "GBNF grammar"})
    json_schema: Any = field(default=None, metadata={"cli": "file", "help": "JSON schema"})
    regex: Optional[str] = field(default=None,
                                 metadata={"cli": "text", "help": "regular expression"})
    choices: Optional[Sequence[str]] = field(
        default=None, metadata={"cli": "list", "help": "an allowed output (repeatable)"})
    lark: Optional[str] = field(default=None,
                                metadata={"cli": "file", "help": "llguidance Lark grammar"})

    def __post_init__(self) -> None:
        # one kind per constraint: with two, ``kind`` would pick one and drop the other
        given = [f.name for f in fields(self) if getattr(self, f.name) is not None]
        if len(given) != 1:
            raise ValueError(f"a Constraint takes one of {[f.name for f in fields(self)]}, "
                             f"got {given or 'none'}")

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Optional["Constraint"]:
        """The constraint of a request's keyword options (None: unconstrained)."""
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown options: {sorted(unknown)} (constraints: {list(OPTIONS)})")
        given = {k: v for k, v in options.items() if v is not None}
        if not given:
            return None
        if len(given) > 1:
            raise ValueError(f"give one constraint, not {sorted(given)}")
        return cls(**given)

    @property
    def kind(self) -> str:
        return next(f.name for f in fields(self) if getattr(self, f.name) is not None)

    def llguidance_grammar(self) -> str:
        """The constraint in llguidance's grammar format (not checked yet)."""
        llg = _llguidance()
        kind, value = self.kind, getattr(self, self.kind)
        if kind == "json_schema":
            try:
                schema = _closed(schema_dict(value))
            except RecursionError:
                raise ValueError("json_schema is nested too deeply") from None
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=dict(JSON_OPTIONS))
        if kind == "choices":
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
                raise ValueError("choices must be a non-empty list of strings")
            for c in value:
                if not isinstance(c, str) or not c:
                    raise ValueError(f"choices must be non-empty strings, got {c!r}")
                _check_text(kind, c)
            # each choice once: llguidance's parser holds a row of one item per alternative,
            # at most MAX_CHOICES + 1 of them, and more failed the request after its first
            # token (5000 copies of one choice did)
            value = list(dict.fromkeys(value))
            if len(value) > MAX_CHOICES:
                raise ValueError(f"at most {MAX_CHOICES} different choices, got {len(value)}")
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c)
                                                                           for c in value))
        if not isinstance(value, str):
            raise ValueError(f"{kind} must be a string, got {type(value).__name__}")
        _check_text(kind, value)
        if kind == "regex":
            if (len(value) - len(value.rstrip("\\"))) % 2:
                # llguidance drops a trailing lone backslash: 'a\\' would match 'a'
                raise ValueError(f"bad regex: {value!r} ends in an incomplete escape ('\\')")
            return llg.LLMatcher.grammar_from_regex(value)
        if kind == "grammar":
            from llguidance.gbnf_to_lark import any_to_lark
            _check_rules(kind, value.count("::="))     # before the converter's time
            try:
                value = _group_stacked_quantifiers(any_to_lark(value))
            except Exception as e:
                raise ValueError(f"bad GBNF grammar: {e}") from None
        _check_rules(kind, len(_LARK_RULE.findall(value)))
        return llg.LLMatcher.grammar_from_lark(value)

    def compile(self, model: "Model") -> "Grammar":
        """For ``model``'s vocabulary (checked when a matcher is made: ``Grammar.state``)."""
        return Grammar(self.kind, self.llguidance_grammar(), tokenizer(model), model)


def _check_rules(kind: str, n_rules: int) -> None:
    if n_rules > MAX_GRAMMAR_RULES:
        raise ValueError(f"the {kind} defines {n_rules} rules; at most {MAX_GRAMMAR_RULES}")


def _check_text(kind: str, text: str) -> None:
    """A ``ValueError`` for text no output can hold (a lone surrogate), before llguidance
    reads it: its encoder's error, or its JSON parser's on an escaped choice, says less."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{kind} is not valid Unicode text (a lone surrogate): "
                         f"{text[:80]!r}") from None


#: the constraint options of a request, in order (CLI, server and API derive theirs)
OPTIONS: Tuple[str, ...] = tuple(f.name for f in fields(Constraint))


def take_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The constraint options among a call's keywords, taken out of ``options`` (what stays
    are its other keywords: sampling options, template variables)."""
    return {k: options.pop(k) for k in OPTIONS if k in options}


def schema_dict(schema: Any) -> Dict[str, Any]:
    """A JSON schema as a dict: from a dict, its JSON text, or a pydantic model class."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    elif isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise ValueError("json_schema must be a JSON object (a dict), its text, or a pydantic "
                         f"model class, got {type(schema).__name__}")
    return dict(schema)


def _group_stacked_quantifiers(lark: str) -> str:
    """``lark`` with each quantifier that follows another one applied to a group of the
    atom and the first: llguidance's GBNF converter drops the parentheses of a one-item
    group, so GBNF's ``(("a")?)?`` or ``("a"*)+`` became ``"a"??`` or ``"a"*+``, which its
    Lark parser refuses; ``("a"?)?`` means the same."""
    out: List[str] = []
    starts: List[int] = []       # where each open parenthesis is in ``out``
    atom = -1                    # where the last atom (literal, class, name, group) starts
    quantified = False           # the last thing written is a quantifier
    i, n = 0, len(lark)
    while i < n:
        ch = lark[i]
        if ch in "\"/[":           # a string, a regex or a character class: copied whole
            close = {"[": "]"}.get(ch, ch)
            j = i + 1
            while j < n and lark[j] != close:
                j += 2 if lark[j] == "\\" else 1
            atom, quantified = len(out), False
            out.append(lark[i:j + 1])
            i = j + 1
            continue
        if ch in "?*+{" and atom >= 0 and (ch != "{" or re.match(r"\{\d+(,\d*)?\}", lark[i:])):
            j = lark.index("}", i) + 1 if ch == "{" else i + 1
            if quantified:
                out.insert(atom, "(")
                out.append(")")
            out.append(lark[i:j])
            quantified = True
            i = j
            continue
        if ch == "(":
            starts.append(len(out))
            atom = -1
        elif ch == ")" and starts:
            atom = starts.pop()
        elif ch.isalnum() or ch == "_":
            if not (out and (out[-1][-1:].isalnum() or out[-1][-1:] == "_")):
                atom = len(out)
        elif not ch.isspace() or ch == "\n":
            atom = -1
        if not ch.isspace() or ch == "\n":
            quantified = False
        out.append(ch)
        i += 1
    return "".join(out)


def _closed(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` where an object schema lists its
    properties and says nothing of others (see ``JSON_OPTIONS``)."""
    if isinstance(node, list):
        return [_closed(x) for x in node]
    if not isinstance(node, Mapping):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class Grammar:
    """A constraint compiled for one model: each request gets its own matcher (``state``)."""

    def __init__(self, kind: str, text: str, tok: Any, model: "Model") -> None:
        self.kind = kind
        self.text = text
        self._tok = tok
        self._n_vocab = model.n_vocab
        eog = model.eog_tokens
        self._eos = model.eos if model.eos >= 0 else (eog[0] if eog else 0)

    def state(self) -> Any:
        """A fresh ``GrammarState`` (the matcher at the start of the output); a
        ``ValueError`` for a grammar llguidance refuses, or one no output can match."""
        from ._grammar import GrammarState
        m = _build_matcher(self._tok, self.text)
        if m.is_error():
            raise ValueError(f"bad {self.kind}: {m.get_error()}")
        st = GrammarState(m, self._n_vocab, self._eos)
        try:
            st.check_start()
        except ValueError as e:
            raise ValueError(f"bad {self.kind}: {e}") from None
        return st


_stack_lock = threading.Lock()


def _build_matcher(tok: Any, text: str) -> Any:
    """llguidance's matcher of ``text``, built on a thread of its own with a stack of
    ``_BUILD_STACK`` (its compiler recurses along chains of rules; see MAX_GRAMMAR_RULES)."""
    llg = _llguidance()
    out: List[Any] = []

    def build() -> None:
        try:
            out.append(llg.LLMatcher(tok, text, log_level=0))
        except BaseException as e:     # handed to the caller's thread
            out.append(e)
    thread = threading.Thread(target=build, name="specdec-grammar-build", daemon=True)
    with _stack_lock:                  # the stack size is the process's setting for new threads
        old = threading.stack_size(_BUILD_STACK)
        try:
            thread.start()
        finally:
            threading.stack_size(old)
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ImportError("constrained output (grammar, json_schema, regex, choices) needs "
                          "llguidance: pip install 'specdec[structured]'") from None
    return llguidance


class _Vocab:
    """What llguidance's ``TokenizerWrapper`` reads of a tokenizer, from the model's
    vocabulary as llama.cpp's own llguidance sampler builds it (common/llguidance.cpp):
    each token's text, control tokens as 0xff + their name, and tokenization by llama.cpp."""

    def __init__(self, model: Model) -> None:
        self._model = weakref.ref(model)     # the cache's value must not keep its key alive
        self.eos_token_id = model.eos
        self.bos_token_id = model.bos if model.bos >= 0 else None
        toks: List[bytes] = []
        special: List[int] = []
        piece = model.token_to_piece
        for t in range(model.n_vocab):
            b = piece(t)
            if not b:
                b = piece(t, special=True)
                if b:
                    b = b"\xff" + b
                    special.append(t)
            toks.append(b)
        self.tokens = toks
        self.special_token_ids = special
        self._special = frozenset(special)
        self._by_piece: Optional[Dict[bytes, int]] = None     # built on first need
        self._longest = 0

    def __call__(self, text: Any) -> List[int]:
        """llama.cpp's tokens for ``text`` (the bytes a grammar forces), where they spell it;
        else the longest pieces of the vocabulary that do, left to right.

        llguidance feeds these tokens to the matcher as the forced text. A tokenizer that adds
        a leading space (a SentencePiece vocabulary with ``add_space_prefix``) or maps bytes
        to ids its pieces do not spell (synthetic vocabularies) would make the matcher take
        other text than the grammar forced, and the request would fail on its next token."""
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this tokenizer was freed")
        toks = model.tokenize(text, add_special=False, parse_special=True)
        want = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if b"".join(self._spelling(t) for t in toks) == want:
            return toks
        return self._greedy(want) or toks

    def _spelling(self, t: int) -> bytes:
        """The text token ``t`` stands for in a tokenization (a control token: its name)."""
        b = self.tokens[t] if 0 <= t < len(self.tokens) else b""
        return b[1:] if b[:1] == b"\xff" and t in self._special else b

    def _greedy(self, want: bytes) -> Optional[List[int]]:
        """The longest vocabulary piece at each place, left to right; None where some byte
        starts no piece."""
        if self._by_piece is None:
            by: Dict[bytes, int] = {}
            for t, b in enumerate(self.tokens):
                if b and t not in self._special:
                    by.setdefault(b, t)
            self._by_piece = by
            self._longest = max(map(len, by), default=0)
        out: List[int] = []
        i = 0
        while i < len(want):
            for n in range(min(self._longest, len(want) - i), 0, -1):
                t = self._by_piece.get(want[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                return None
        return out


_tokenizers: "weakref.WeakKeyDictionary[Model, Any]" = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer(model: Model) -> Any:
    """llguidance's tokenizer of ``model``, built once per model (a pass over its vocabulary),
    every end-of-generation token its end of text."""
    with _tokenizers_lock:
        tok = _tokenizers.get(model)
        if tok is None:
            llg = _llguidance()
            from llguidance import TokenizerWrapper
            eog = [t for t in list(model.eog_tokens) or [model.eos] if t >= 0]
            if not eog:
                # the grammar's end is its end of text: without one no output could finish
                raise ValueError("constrained output needs the model's end-of-generation "
                                 "token, and this model declares none (its GGUF has no "
                                 "tokenizer.ggml.eos_token_id)")
            tok = llg.LLTokenizer(TokenizerWrapper(_Vocab(model)), n_vocab=model.n_vocab,
                                  eos_token=eog)
            _tokenizers[model] = tok
        return tok
