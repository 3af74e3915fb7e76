"""specdec: speculative decoding on llama.cpp, with a Cython core over libllama.

>>> import specdec
>>> dec = specdec.Decoder("model.gguf", drafter="ngram", n_max=4)   # doctest: +SKIP
>>> dec.generate("def fib(n):", max_tokens=64).text                  # doctest: +SKIP
"""
from ._core import (
    Batch,
    Context,
    ContextBusyError,
    ContextFullError,
    DecodeError,
    DecodeTimeoutError,
    LlamaAbortError,
    Model,
    RPCError,
    TargetView,
    backends,
    devices,
    system_info,
)
from ._gguf_layout import GGUFError
from .api import Decoder, Stream, generate, stream
from .engine import AsyncStream, Engine, EngineClosed, RequestHandle
from .config import Sampling, SpecConfig
from .constraint import Constraint
from .drafters import Drafter, DrafterError, register
from .models import ModelNotAvailable, default_model_path
from .probe import check_model
from .results import GenerationResult, Piece, Stats, TokenLogprob

__version__ = "0.1.0"

__all__ = [
    "AsyncStream", "Batch", "Constraint", "Context", "ContextBusyError", "ContextFullError",
    "DecodeError",
    "DecodeTimeoutError", "Decoder", "Engine", "EngineClosed", "Piece", "RequestHandle", "TokenLogprob",
    "Drafter", "DrafterError", "GGUFError", "GenerationResult", "LlamaAbortError", "Model",
    "ModelNotAvailable", "RPCError", "Sampling", "SpecConfig", "Stats", "Stream", "TargetView",
    "backends", "check_model", "default_model_path", "devices", "generate", "register",
    "stream", "system_info",
]
