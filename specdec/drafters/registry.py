"""Drafters by name: the built-ins, ``@register``-ed classes, and pip-installed plugins.

A plugin package declares an entry point in the ``specdec.drafters`` group::

    [project.entry-points."specdec.drafters"]
    my-drafter = "my_pkg.drafters:MyDrafter"

and ``specdec generate --drafter my-drafter`` finds it.
"""
from __future__ import annotations

from importlib import metadata
from typing import Any, Callable, Dict, List, Optional, Union

from ._base import Drafter, DrafterError

ENTRY_POINT_GROUP = "specdec.drafters"

_registry: Dict[str, Callable[..., Any]] = {}
_sources: Dict[str, str] = {}


def register(name: str, *, replace: bool = False):
    """Class decorator: make a drafter available by ``name``.

    The class (or factory) is called as ``factory()`` or, for ``name:ARG``
    specs, ``factory(ARG)``; keyword options come from ``create(..., **options)``.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"drafter names are non-empty strings without ':', got {name!r}")

    def deco(factory):
        if name in _registry and not replace and _registry[name] is not factory:
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


def _load_plugin(name: str) -> Optional[Callable[..., Any]]:
    for ep in _entry_points():
        if ep.name == name:
            factory = ep.load()
            _registry.setdefault(name, factory)
            _sources.setdefault(name, f"plugin {ep.value}")
            if not getattr(factory, "drafter_name", None):
                _set_name(factory, name)
            return _registry[name]
    return None


def available() -> Dict[str, str]:
    """Every drafter name with where it comes from (module, or plugin entry point)."""
    _load_builtins()
    out = dict(_sources)
    for ep in _entry_points():
        out.setdefault(ep.name, f"plugin {ep.value}")
    return dict(sorted(out.items()))


def _load_builtins() -> None:
    from . import builtin  # noqa: F401  (registers the built-in drafters)


def get(name: str) -> Callable[..., Any]:
    _load_builtins()
    factory = _registry.get(name) or _load_plugin(name)
    if factory is None:
        raise ValueError(f"unknown drafter {name!r}; available: {', '.join(available())}")
    return factory


def create(spec: Union[str, Drafter, Any], **options: Any) -> Drafter:
    """A drafter from a name (``"ngram"``, ``"draft:PATH"``, ``"layerskip:6"``), an
    instance, or any object with a ``propose`` method (wrapped)."""
    if isinstance(spec, Drafter):
        if options:
            raise ValueError("options apply to drafters created by name")
        return spec
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        factory = get(name)
        d = factory(arg, **options) if arg else factory(**options)
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


__all__ = ["register", "available", "get", "create", "wrap", "Drafter", "DrafterError",
           "ENTRY_POINT_GROUP"]
