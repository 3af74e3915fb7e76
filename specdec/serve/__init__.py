"""``specdec serve``: an OpenAI-compatible HTTP server over specdec (extra ``specdec[serve]``).

``create_app(backend, model_names)`` gives the ASGI app; ``specdec serve`` runs it with uvicorn.
"""
from __future__ import annotations

from .app import create_app
from .backend import EngineBackend

__all__ = ["EngineBackend", "create_app"]
