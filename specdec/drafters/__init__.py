"""Drafters: the base interface, the registry, and the built-in drafters.

Write your own by subclassing :class:`Drafter` and overriding ``propose``::

    from specdec.drafters import Drafter, register

    @register("repeat-last")
    class RepeatLast(Drafter):
        def propose(self, seq, last_token, n_max):
            return [last_token] * n_max

The built-in classes (``NgramDrafter``, ``SuffixDrafter``, ``MtpDrafter``...) are
importable from here; each is loaded on first use, so ``import specdec`` loads none.
"""
from typing import TYPE_CHECKING, Any, List

from ._base import Draft, Drafter, DrafterError
from .registry import (BUILTINS, ENTRY_POINT_GROUP, OVERRIDE_ENV, available, create, describe,
                       get, register, wrap)

if TYPE_CHECKING:   # type checkers see the classes; at runtime __getattr__ loads them
    from .dflash import DFlashDrafter as DFlashDrafter
    from .draft_model import DraftModelDrafter as DraftModelDrafter
    from .eagle3 import Eagle3Drafter as Eagle3Drafter
    from .layerskip import LayerSkipDrafter as LayerSkipDrafter
    from .mtp import MtpDrafter as MtpDrafter
    from .ngram import NgramDrafter as NgramDrafter
    from .ngram_cache import NgramCacheDrafter as NgramCacheDrafter
    from .ngram_map import NgramMapDrafter as NgramMapDrafter
    from .ngram_map import NgramMapK4VDrafter as NgramMapK4VDrafter
    from .suffix import SuffixDrafter as SuffixDrafter

_CLASSES = {b.cls: b.module for b in BUILTINS.values()}


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_CLASSES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_CLASSES))


__all__ = ["Draft", "Drafter", "DrafterError", "register", "available", "describe", "create",
           "get", "wrap", "BUILTINS", "ENTRY_POINT_GROUP", "OVERRIDE_ENV", *sorted(_CLASSES)]
