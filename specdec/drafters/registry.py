"""Drafters by name: the built-ins, ``@register``-ed classes, and pip-installed plugins.

A plugin package declares an entry point in the ``specdec.drafters`` group::

    [project.entry-points."specdec.drafters"]
    my-drafter = "my_pkg.drafters:MyDrafter"

and ``specdec generate --drafter my-drafter`` finds it.
"""
from __future__ import annotations

import importlib
import logging
import os
from importlib import metadata
from typing import Any, Callable, Dict, List, NamedTuple, Optional, TypeVar, Union

from ._base import Drafter, DrafterError

ENTRY_POINT_GROUP = "specdec.drafters"
#: names of entry-point plugins allowed to replace a built-in drafter (comma-separated)
OVERRIDE_ENV = "SPECDEC_DRAFTER_OVERRIDE"

_log = logging.getLogger("specdec.drafters")


class Builtin(NamedTuple):
    """A built-in drafter, declared so that listing them imports none."""

    module: str        # under specdec.drafters
    cls: str
    usage: str         # the spec syntax; ``[...]`` is optional
    summary: str


BUILTINS: Dict[str, Builtin] = {
    "ngram": Builtin("ngram", "NgramDrafter", "ngram[:N]",
                     "prompt lookup: what followed the latest match of the last N tokens (N=3)"),
    "ngram-map": Builtin("ngram_map", "NgramMapDrafter", "ngram-map[:N]",
                         "most frequent continuation of a key N-gram (N=12), with accept feedback"),
    "ngram-map-k4v": Builtin("ngram_map", "NgramMapK4VDrafter", "ngram-map-k4v[:N]",
                             "the dominant one of up to four continuations per key N-gram"),
    "ngram-cache": Builtin("ngram_cache", "NgramCacheDrafter", "ngram-cache[:STATIC_PATH]",
                           "llama.cpp's 3-level n-gram cache; persists across requests"),
    "suffix": Builtin("suffix", "SuffixDrafter", "suffix[:DEPTH]",
                      "suffix tree over the request and earlier ones (DEPTH=64)"),
    "draft": Builtin("draft_model", "DraftModelDrafter", "draft:PATH",
                     "a smaller GGUF with the target's vocabulary (another one with "
                     "translate=True / --draft-translate)"),
    "layerskip": Builtin("layerskip", "LayerSkipDrafter", "layerskip:N",
                         "the target's own first N layers (derived once into the cache)"),
    "mtp": Builtin("mtp", "MtpDrafter", "mtp[:PATH|q8_0|q5_0|q4_0]",
                   "the target's MTP head, an MTP-only GGUF, or a requantized copy of the head"),
    "eagle3": Builtin("eagle3", "Eagle3Drafter", "eagle3:PATH",
                      "an EAGLE-3 head GGUF that reads the target's intermediate layer inputs"),
    "dflash": Builtin("dflash", "DFlashDrafter", "dflash:PATH",
                      "a DFlash block-diffusion GGUF: a whole block per decode, from the "
                      "target's layer inputs"),
}

_registry: Dict[str, Callable[..., Any]] = {}
_sources: Dict[str, str] = {}
_replaced: set = set()     # built-in names a user or an opted-in plugin took over


F = TypeVar("F", bound=Callable[..., Any])


def register(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Class decorator: make a drafter available by ``name``.

    The class (or factory) is called as ``factory()`` or, for ``name:ARG``
    specs, ``factory(ARG)``; keyword options come from ``create(..., **options)``.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"drafter names are non-empty strings without ':', got {name!r}")

    def deco(factory: F) -> F:
        if name in BUILTINS:          # built-ins are declared above, never registered
            if not replace:
                raise ValueError(f"{name!r} is a built-in drafter; pick another name, or "
                                 f"register({name!r}, replace=True) to replace it")
            _log.warning("drafter %r (%s) replaces the built-in one", name, factory.__module__)
            _replaced.add(name)
        elif name in _registry and not replace and _registry[name] is not factory:
            raise ValueError(f"a drafter named {name!r} is already registered")
        _registry[name] = factory
        _sources[name] = getattr(factory, "__module__", "?")
        _set_name(factory, name)
        return factory

    return deco


def _set_name(factory: Any, name: str) -> None:
    if isinstance(factory, type):
        try:
            factory.drafter_name = name
        except (TypeError, AttributeError):  # Cython extension types: names come via __init__
            pass


def _entry_points() -> List[Any]:
    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except TypeError:  # Python < 3.10
        return list(metadata.entry_points().get(ENTRY_POINT_GROUP, []))


def _overrides() -> set:
    return {n.strip() for n in os.environ.get(OVERRIDE_ENV, "").split(",") if n.strip()}


_warned_shadow: set = set()


def _shadowed(ep: Any) -> bool:
    """A plugin named like a built-in loses (with one warning) unless ``$SPECDEC_DRAFTER_OVERRIDE``
    names it."""
    if ep.name not in BUILTINS or ep.name in _overrides():
        return False
    if ep.name not in _warned_shadow:
        _warned_shadow.add(ep.name)
        _log.warning("plugin drafter %r (%s) has the name of a built-in drafter and is ignored; "
                     "set %s=%s to use the plugin instead", ep.name, ep.value, OVERRIDE_ENV, ep.name)
    return True


def _load_plugin(name: str) -> Optional[Callable[..., Any]]:
    for ep in _entry_points():
        if ep.name == name and not _shadowed(ep):
            if name in BUILTINS:
                _registry[name] = ep.load()   # the user opted in: the plugin replaces the built-in
                _replaced.add(name)
                _sources[name] = f"plugin {ep.value}"
            factory = ep.load()
            _registry.setdefault(name, factory)
            _sources.setdefault(name, f"plugin {ep.value}")
            if not getattr(factory, "drafter_name", None):
                _set_name(factory, name)
            return _registry[name]
    return None


def available() -> Dict[str, str]:
    """Every drafter name with where it comes from (module, or plugin entry point),
    without importing any drafter."""
    out = {n: f"{__package__}.{b.module}" for n, b in BUILTINS.items()}
    out.update(_sources)
    for ep in _entry_points():
        if ep.name in BUILTINS and not _shadowed(ep):
            out[ep.name] = f"plugin {ep.value}"
        out.setdefault(ep.name, f"plugin {ep.value}")
    return dict(sorted(out.items()))


def describe(name: str) -> tuple:
    """``(usage, one-line summary)`` of a drafter, for listings."""
    b = BUILTINS.get(name)
    if b is not None and name not in _replaced:
        return b.usage, b.summary
    try:
        factory = get(name)
    except Exception as e:  # a plugin that fails to load still gets a line
        return name, f"(cannot load: {type(e).__name__}: {e})"
    doc = (getattr(factory, "__doc__", None) or "").strip()
    return getattr(factory, "usage", None) or name, doc.splitlines()[0] if doc else ""


def _builtin_class(name: str) -> Callable[..., Any]:
    b = BUILTINS[name]
    return getattr(importlib.import_module(f"{__package__}.{b.module}"), b.cls)


def get(name: str) -> Callable[..., Any]:
    """The class (or factory) registered under ``name``; built-ins are imported on first use."""
    factory = _registry.get(name) or _load_plugin(name)
    if factory is None and name in BUILTINS:
        factory = _builtin_class(name)
        _registry.setdefault(name, factory)
    if factory is None:
        raise ValueError(f"unknown drafter {name!r}; available: {', '.join(available())} "
                         "(`specdec drafters` shows their arguments)")
    return factory


def create(spec: Union[str, Drafter, Any], **options: Any) -> Drafter:
    """A drafter from a name (``"ngram"``, ``"draft:PATH"``, ``"layerskip:6"``), an
    instance, or any object with a ``propose`` method (wrapped)."""
    if isinstance(spec, Drafter):
        if options:
            raise ValueError("options apply to drafters created by name")
        return spec
    if isinstance(spec, type):
        if spec is Drafter or not issubclass(spec, Drafter):
            raise TypeError(f"drafter={spec.__name__} is a class: pass an instance "
                            f"({spec.__name__}(...)), a Drafter subclass that overrides "
                            "propose(), or a name such as 'ngram'")
        return spec(**options)
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        factory = get(name)
        usage = describe(name)[0]
        if not arg and ":" in usage and "[:" not in usage:
            raise ValueError(f"drafter {name!r} needs an argument: {usage}")
        try:
            d = factory(arg, **options) if arg else factory(**options)
        except (ValueError, TypeError) as e:
            raise ValueError(f"bad drafter {spec!r} (usage: {usage}): {e}") from e
        if not isinstance(d, Drafter):
            d = wrap(d, name)
        return d
    if callable(getattr(spec, "propose", None)):
        return wrap(spec, getattr(spec, "name", None) or type(spec).__name__)
    raise TypeError(f"a drafter is a name, a Drafter, or an object with propose(); "
                    f"got {type(spec).__name__}")


class _Wrapped(Drafter):
    """Adapts a duck-typed object (``propose`` and optional hooks) to the interface."""

    def __init__(self, obj: Any, name: str):
        super().__init__(name)
        self._obj = obj

    def begin(self, seq, prompt_tokens):
        f = getattr(self._obj, "begin", None)
        if f is not None:
            f(seq, prompt_tokens)

    def observe(self, seq, tokens):
        f = getattr(self._obj, "observe", None)
        if f is not None:
            f(seq, tokens)

    def propose(self, seq, last_token, n_max):
        return self._obj.propose(seq, last_token, n_max)

    def accept(self, seq, n_accepted):
        f = getattr(self._obj, "accept", None)
        if f is not None:
            f(seq, n_accepted)

    def reset(self, seq):
        f = getattr(self._obj, "reset", None)
        if f is not None:
            f(seq)


def wrap(obj: Any, name: str) -> Drafter:
    if not callable(getattr(obj, "propose", None)):
        raise TypeError(f"drafter {name!r} has no propose() method")
    return _Wrapped(obj, name)


__all__ = ["register", "available", "describe", "get", "create", "wrap", "Drafter",
           "DrafterError", "BUILTINS", "ENTRY_POINT_GROUP", "OVERRIDE_ENV"]
