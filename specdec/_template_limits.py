"""Chat templates rendered with a time limit and a size limit.

Why: a chat template is code. A server renders templates it did not write (a request's
``chat_template``), and Jinja's sandbox guards attributes, not resources: ``10**10`` loop
iterations never end, ``'a' * 2000000000`` or ``'{:>2000000000}'.format(x)`` allocate
gigabytes before anything can look at the result, ``(10**100000)|string`` raises
``ValueError``, a self-recursive macro ``RecursionError``, ``truncate(-1)``
``AssertionError``. Each is one :class:`ChatTemplateError` here, within the limits.

How:

- Size: no value a template builds may exceed ``max_chars`` characters (items, for lists),
  checked *before* the operation that would build it wherever the size can be known in
  advance: the arithmetic operators (the sandbox's intercepted binary operators), ``%``
  and ``str.format`` padding, the string methods that pad or repeat (``center``,
  ``ljust``, ``zfill``, ``replace``, ``join``, ...), the filters that do (``center``,
  ``indent``, ``wordwrap``, ``join``, ``replace``, ``batch``, ``slice``, ``tojson``'s
  indent), and every concatenation (``~``, a macro's or block's body, the output itself).
  Any other filter or call gets an input of at most ``max_chars`` and its result is checked
  after (the growth of one such operation is a small constant factor). Integers are held
  to ``MAX_INT_BITS``.
- Time: a watchdog thread raises an exception in the rendering thread when
  ``seconds`` have passed (``PyThreadState_SetAsyncExc``, delivered between bytecodes:
  Jinja compiles templates to Python, so every loop reaches one). Single operations are
  bounded by the size checks, so none runs long in C.
- Errors: anything a template raises, at compile time or render time, is a
  ``ChatTemplateError`` (a subclass of ``ValueError``).

``lipsum`` (a text generator with unbounded arguments) is removed from the globals; chat
templates have no use for it.
"""
from __future__ import annotations

import ctypes
import functools
import re
import string
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, TypeVar

#: integers a template computes stay below 2**MAX_INT_BITS (str() of larger ones fails anyway)
MAX_INT_BITS = 1 << 16
#: the widest tojson indent a template may ask for
MAX_JSON_INDENT = 16
#: the longest template source accepted
MAX_SOURCE_CHARS = 1 << 20

T = TypeVar("T")


class ChatTemplateError(ValueError):
    """A template that cannot be used, or that refused the conversation (``raise_exception``),
    or that failed or ran past its limits (:class:`TemplateLimits`)."""


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render (and one compilation) of a Jinja chat template.

    ``seconds``: wall-clock time (0: none); ``max_chars``: the largest string (or list, in
    items) the template may build, the rendered prompt included."""

    seconds: float = 5.0
    max_chars: int = 8_000_000

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and self.seconds >= 0):
            raise ValueError(f"template time limit must be a number of seconds >= 0, got "
                             f"{self.seconds!r}")
        if not (isinstance(self.max_chars, int) and self.max_chars >= 1024):
            raise ValueError(f"template size limit must be an int >= 1024, got "
                             f"{self.max_chars!r}")


DEFAULT_LIMITS = TemplateLimits()


# --- time ------------------------------------------------------------------------------

class _Deadline(BaseException):
    """Raised in the rendering thread by the watchdog (a BaseException: no ``except
    Exception`` on the way swallows it)."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


class _Watchdog:
    """Raises _Deadline once in thread ``tid`` after ``seconds``, unless stopped first."""

    def __init__(self, seconds: float) -> None:
        self.tid = threading.get_ident()
        self.lock = threading.Lock()
        self.done = False
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(seconds,), daemon=True,
                                       name="specdec-template-watchdog")
        self.thread.start()

    def _run(self, seconds: float) -> None:
        if self.stopped.wait(seconds):
            return
        with self.lock:
            if not self.done:
                _set_async_exc(self.tid, _Deadline)

    def stop(self) -> None:
        with self.lock:
            self.done = True
            self.stopped.set()
            # an exception raised but not yet delivered is withdrawn
            _set_async_exc(self.tid, ctypes.py_object())


def _stop(w: _Watchdog) -> None:
    try:
        w.stop()
    except _Deadline:   # delivered inside stop(): it was the only one, stop again
        w.stop()


def run_limited(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()``, or ChatTemplateError when it runs past ``seconds`` or raises."""
    if seconds <= 0:
        return _as_template_error(fn, what)
    w = _Watchdog(seconds)
    timed_out = False
    try:
        try:
            return _as_template_error(fn, what)
        finally:
            _stop(w)
    except _Deadline:
        timed_out = True
    assert timed_out
    raise ChatTemplateError(f"chat template {what} took longer than the {seconds:g} s limit")


def _as_template_error(fn: Callable[[], T], what: str) -> T:
    try:
        return fn()
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateError(f"chat template {what} failed: it recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError(f"chat template {what} failed: out of memory") from None
    except Exception as e:
        import jinja2
        if isinstance(e, jinja2.TemplateSyntaxError):
            raise ChatTemplateError(f"chat template: {e.message} (line {e.lineno})") from None
        if isinstance(e, jinja2.TemplateError):
            raise ChatTemplateError(f"chat template {what} failed: {e}") from None
        raise ChatTemplateError(f"chat template {what} failed: {type(e).__name__}: "
                                f"{str(e)[:200]}") from None


# --- size ------------------------------------------------------------------------------

_SIZED = (str, list, tuple, dict)
# printf-style conversions: %(name)-08.3f
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _too_big(what: str, n: int, cap: int) -> ChatTemplateError:
    return ChatTemplateError(f"chat template failed: {what} would be {n} long, over the "
                             f"template size limit of {cap}")


def _check_size(value: Any, cap: int, what: str) -> Any:
    if isinstance(value, _SIZED) and len(value) > cap:
        raise _too_big(what, len(value), cap)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise ChatTemplateError(f"chat template failed: {what} is an integer of "
                                f"{value.bit_length()} bits, over {MAX_INT_BITS}")
    return value


def _check_printf(fmt: str, cap: int) -> None:
    for m in _PRINTF.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise ChatTemplateError("chat template failed: '*' widths in % formatting are "
                                        "not supported")
            if g is not None and int(g) > cap:
                raise _too_big("a % format's width", int(g), cap)


def _check_format_spec(fmt: str, cap: int) -> None:
    """str.format: every width and precision in the replacement fields' specs."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise ChatTemplateError(f"chat template failed: bad format string: {e}") from None
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise ChatTemplateError("chat template failed: nested fields in format specs "
                                    "are not supported")
        for d in _DIGITS.findall(spec):
            if len(d) > 12 or int(d) > cap:
                raise _too_big("a format's width", int(d[:13]), cap)
        _check_format_spec(spec, cap)


def _str_method_size(s: str, name: str, args: tuple, kwargs: dict) -> Optional[int]:
    """The size a padding/repeating str method's result would have, before calling it."""
    a = list(args) + list(kwargs.values())
    if name in ("center", "ljust", "rjust", "zfill"):
        return a[0] if a and isinstance(a[0], int) else None
    if name == "expandtabs":
        tab = a[0] if a and isinstance(a[0], int) else 8
        return len(s) + s.count("\t") * max(tab, 0)
    if name == "replace" and len(a) >= 2 and isinstance(a[0], str) and isinstance(a[1], str):
        n = s.count(a[0]) if a[0] else len(s) + 1
        if len(a) > 2 and isinstance(a[2], int) and a[2] >= 0:
            n = min(n, a[2])
        return len(s) + n * max(len(a[1]) - len(a[0]), 0)
    return None


def _str_sizes(items: Iterable[Any]) -> int:
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items)


def _sandbox_class() -> type:
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _BoundedCodeGenerator(CodeGenerator):
        """``a ~ b`` joins through the environment's bounded concat."""

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.sd_str_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox with every value held to ``max_chars``."""

        code_generator_class = _BoundedCodeGenerator
        intercepted_binops = frozenset(["+", "-", "*", "/", "//", "%", "**"])

        def __init__(self, max_chars: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_chars = max_chars
            self.globals.pop("lipsum", None)
            for name, f in list(self.filters.items()):
                self.filters[name] = self._bounded_filter(name, f)

        def concat(self, pieces: Iterable[Any]) -> str:   # type: ignore[override]
            cap, total, out = self.max_chars, 0, []
            for p in pieces:
                total += len(p)
                if total > cap:
                    raise _too_big("the text", total, cap)
                out.append(p)
            return "".join(out)

        def sd_str_join(self, seq: Iterable[Any]) -> str:
            return self.concat(x if isinstance(x, str) else str(x) for x in seq)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            cap = self.max_chars
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                            and len(seq) * max(n, 0) > cap:
                        raise _too_big("a repetition", len(seq) * n, cap)
                if isinstance(left, int) and isinstance(right, int) \
                        and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise ChatTemplateError("chat template failed: an integer product over "
                                            f"{MAX_INT_BITS} bits")
            elif operator == "**":
                if isinstance(left, int) and isinstance(right, int) and right > 0 \
                        and abs(left) > 1 and right * left.bit_length() > MAX_INT_BITS:
                    raise ChatTemplateError("chat template failed: a power over "
                                            f"{MAX_INT_BITS} bits")
            elif operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) \
                        and len(left) + len(right) > cap:
                    raise _too_big("a concatenation", len(left) + len(right), cap)
            elif operator == "%" and isinstance(left, str):
                _check_printf(left, cap)
            return _check_size(super().call_binop(context, operator, left, right), cap,
                               f"the result of {operator!r}")

        def wrap_str_format(self, value: Any) -> Optional[Callable[..., str]]:
            f = super().wrap_str_format(value)
            if f is None:
                return None
            fmt, cap = value.__self__, self.max_chars

            def bounded(*args: Any, **kwargs: Any) -> str:
                _check_format_spec(fmt, cap)
                return _check_size(f(*args, **kwargs), cap, "a formatted string")
            return bounded

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            cap = __self.max_chars
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, str):
                if name in ("translate", "maketrans"):
                    raise ChatTemplateError(f"chat template failed: str.{name} is not "
                                            "available in chat templates")
                if name == "join":
                    items = list(args[0]) if args else []
                    n = _str_sizes(items) + max(len(items) - 1, 0) * len(owner)
                    if n > cap:
                        raise _too_big("a join", n, cap)
                    args = (items,) + tuple(args[1:])
                else:
                    n = _str_method_size(owner, name, args, kwargs)
                    if n is not None and n > cap:
                        raise _too_big(f"str.{name}'s result", n, cap)
            for a in args:
                _check_size(a, cap, "an argument")
            return _check_size(super().call(__context, __obj, *args, **kwargs), cap,
                               f"the result of {name or 'a call'}")

        def _bounded_filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
            cap = self.max_chars
            pre = _FILTER_SIZE.get(name)

            @functools.wraps(f)
            def bounded(*args: Any, **kwargs: Any) -> Any:
                for a in args:
                    _check_size(a, cap, f"the input of |{name}")
                if pre is not None:
                    n = pre(_filter_value(f, args), _filter_args(f, args), kwargs)
                    if n is not None and n > cap:
                        raise _too_big(f"|{name}'s result", n, cap)
                return _check_size(f(*args, **kwargs), cap, f"the result of |{name}")
            return bounded

    return BoundedSandbox


def _filter_value(f: Callable[..., Any], args: tuple) -> Any:
    """A filter's value: its first argument after the context/environment ones that Jinja's
    pass_* decorators add."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
    return args[skip] if len(args) > skip else None


def _filter_args(f: Callable[..., Any], args: tuple) -> list:
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
    return list(args[skip + 1:])


def _arg(a: list, kw: dict, i: int, name: str, default: Any) -> Any:
    return a[i] if len(a) > i else kw.get(name, default)


def _size_of(x: Any) -> int:
    return len(x) if isinstance(x, str) else len(str(x))


def _indent_size(v: Any, a: list, kw: dict) -> Optional[int]:
    width = _arg(a, kw, 0, "width", 4)
    w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    s = v if isinstance(v, str) else str(v)
    return len(s) + (s.count("\n") + 1) * max(w, 0)


def _wordwrap_size(v: Any, a: list, kw: dict) -> Optional[int]:
    width = _arg(a, kw, 0, "width", 79)
    wrap = _arg(a, kw, 3, "wrapstring", None) or "\n"
    s = v if isinstance(v, str) else str(v)
    if not isinstance(width, int) or not isinstance(wrap, str):
        return None
    return len(s) + (len(s) // max(width, 1) + 1) * len(wrap)


def _join_size(v: Any, a: list, kw: dict) -> Optional[int]:
    if not isinstance(v, (list, tuple, str)):
        return None
    d = _arg(a, kw, 0, "d", "")
    return _str_sizes(v) + max(len(v) - 1, 0) * _size_of(d)


def _replace_size(v: Any, a: list, kw: dict) -> Optional[int]:
    old, new = _arg(a, kw, 0, "old", None), _arg(a, kw, 1, "new", None)
    count = _arg(a, kw, 2, "count", None)
    if not isinstance(old, str) or not isinstance(new, str):
        return None
    return _str_method_size(v if isinstance(v, str) else str(v), "replace",
                            (old, new) + ((count,) if isinstance(count, int) else ()), {})


def _count_arg(i: int, name: str) -> Callable[[Any, list, dict], Optional[int]]:
    def size(v: Any, a: list, kw: dict) -> Optional[int]:
        n = _arg(a, kw, i, name, 0)
        return n if isinstance(n, int) else None
    return size


def _format_size(v: Any, a: list, kw: dict) -> Optional[int]:
    if isinstance(v, str):
        _check_printf(v, 1 << 62)   # '*' refused; the widths are checked against the cap below
        widths = [int(g) for m in _PRINTF.finditer(v) for g in m.groups() if g]
        return len(v) + sum(widths) + sum(_size_of(x) for x in a + list(kw.values()))
    return None


def _tojson_size(v: Any, a: list, kw: dict) -> Optional[int]:
    indent = _arg(a, kw, 0, "indent", None)
    if indent is not None and (not isinstance(indent, (int, str)) or isinstance(indent, bool)
                               or (len(indent) if isinstance(indent, str) else indent)
                               > MAX_JSON_INDENT):
        raise ChatTemplateError(f"chat template failed: tojson indent {indent!r:.20} is over "
                                f"{MAX_JSON_INDENT}")
    return None


#: filters whose result size is known before they run (value, positional args, kwargs)
_FILTER_SIZE = {
    "center": _count_arg(0, "width"), "indent": _indent_size, "wordwrap": _wordwrap_size,
    "join": _join_size, "replace": _replace_size, "batch": _count_arg(0, "linecount"),
    "slice": _count_arg(0, "slices"), "format": _format_size, "tojson": _tojson_size,
}


@functools.lru_cache(maxsize=1)
def sandbox_class() -> type:
    """The bounded sandbox environment class (built on first use: Jinja is imported lazily)."""
    return _sandbox_class()


def check_source(source: str) -> None:
    if len(source) > MAX_SOURCE_CHARS:
        raise ChatTemplateError(f"chat template of {len(source)} characters is over the "
                                f"{MAX_SOURCE_CHARS} limit")
