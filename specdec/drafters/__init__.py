"""Drafters: the base interface, the registry, and the built-in drafters.

Write your own by subclassing :class:`Drafter` and overriding ``propose``::

    from specdec.drafters import Drafter, register

    @register("repeat-last")
    class RepeatLast(Drafter):
        def propose(self, seq, last_token, n_max):
            return [last_token] * n_max
"""
from ._base import Draft, Drafter, DrafterError
from .registry import ENTRY_POINT_GROUP, available, create, get, register, wrap

__all__ = ["Draft", "Drafter", "DrafterError", "register", "available", "create", "get", "wrap",
           "ENTRY_POINT_GROUP"]
