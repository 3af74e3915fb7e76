"""``specdec serve``: an OpenAI-compatible HTTP server over specdec (extra ``specdec[serve]``).

``create_app(backend, model_names)`` gives the ASGI app; ``specdec serve`` runs it with uvicorn.
Both load on first use: the CLI imports ``specdec.serve.cli`` for every command, and the
other commands must work without the extra installed.
"""
from __future__ import annotations

from typing import Any

__all__ = ["EngineBackend", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "EngineBackend":
        from .backend import EngineBackend
        return EngineBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
