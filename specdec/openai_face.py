"""OpenAI-shaped calls in Python: ``create_completion`` / ``create_chat_completion``.

llama-cpp-python's ``Llama.create_completion`` and ``create_chat_completion`` return
OpenAI's response objects as dicts; :class:`~specdec.Decoder` and :class:`~specdec.Engine`
offer the same calls. A call takes the body of a ``/v1/completions`` or
``/v1/chat/completions`` request as keywords (``max_tokens``, ``temperature``, ``stop``,
``logprobs``, ``stream``, ``seed``, ...) and returns what ``specdec serve`` answers to it:
the request is checked, defaulted, refused (:mod:`specdec.refused`) and shaped by the
server's own protocol module (:mod:`specdec.serve.protocol`, plain Python without the ASGI
stack), so the two faces cannot drift apart. ``stream=True`` gives the chunks as an
iterator (an async iterator from the Engine's ``acreate_*``).

The defaults are OpenAI's, as the server's (``temperature`` 1, completions ``max_tokens``
16), not llama-cpp-python's. A bad request raises ``ValueError`` (``ContextFullError`` for
a prompt that does not fit), naming the field.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Tuple, Union

from ._core import ContextFullError

Answer = Dict[str, Any]
Chunks = Iterator[Answer]


def _python_error(e: Any) -> Exception:
    """The server's ``APIError`` as the exception a Python caller expects."""
    if e.status == 413:
        return ContextFullError(e.message)
    return ValueError(e.message)


def prepare(kind: str, body: Dict[str, Any], model: Any, n_ctx_seq: int,
            chat_template: Optional[str], options_ok: bool) -> Tuple[Any, Any, Any]:
    """``(spec, work, envelope)`` of a request body, checked as the server checks it."""
    from .serve.protocol import APIError, Envelope, chat_spec, completion_spec, work
    name = Path(model.path or "model").stem
    try:
        spec = (chat_spec if kind == "chat" else completion_spec)(body, [name])
        if spec.options and not options_ok:
            raise APIError(400, "the 'specdec' request options (drafter, n_max) need an Engine",
                           param="specdec")
        w = work(spec, model, n_ctx_seq, chat_template)
    except APIError as e:
        raise _python_error(e) from None
    return spec, w, Envelope(spec.kind, spec.model)


def _whole(env: Any, model: Any, res: Any) -> Answer:
    from .serve.protocol import full_response, token_logprobs
    return full_response(env, res, token_logprobs(model, res.tokens, res.logprobs))


def _chunks(env: Any, spec: Any, model: Any, pieces: Iterator[Any], result: Any) -> Chunks:
    """The stream's chunks; ``result()`` gives the finished result after the pieces."""
    from .serve.protocol import Chunks as ChunkWriter, token_logprobs
    out = ChunkWriter(env, spec.include_usage)
    yield from out.start()
    for p in pieces:
        yield out.piece(p.text, token_logprobs(model, p.tokens, p.logprobs))
    yield from out.end(result())


def decoder_call(dec: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                 ) -> Union[Answer, Chunks]:
    """A request on a :class:`~specdec.Decoder` (its one sequence)."""
    spec, w, env = prepare(kind, body, dec.model, dec._ctl.n_ctx_seq, chat_template, False)
    if not spec.stream:
        return _whole(env, dec.model, dec.generate(w.tokens, **w.run_args()))
    st = dec.stream(w.tokens, **w.run_args())

    def chunks() -> Chunks:
        try:
            yield from _chunks(env, spec, dec.model, st.pieces(), lambda: st.result)
        finally:
            st.close()      # abandoned half-way: the Decoder is free again
    return chunks()


def engine_call(eng: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                ) -> Union[Answer, Chunks]:
    """A request on an :class:`~specdec.Engine`, waited for in this thread."""
    spec, w, env = prepare(kind, body, eng.model, eng.n_ctx, chat_template, True)
    handle = eng.submit(w.tokens, **w.engine_args())
    if not spec.stream:
        return _whole(env, eng.model, handle.result())

    def chunks() -> Chunks:
        try:
            yield from _chunks(env, spec, eng.model, handle.pieces(), handle.result)
        finally:
            handle.cancel()     # abandoned half-way: its slot is freed at the next round
    return chunks()


async def engine_acall(eng: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                       ) -> Union[Answer, AsyncIterator[Answer]]:
    """A request on an :class:`~specdec.Engine` from asyncio."""
    from .serve.protocol import Chunks as ChunkWriter, token_logprobs
    spec, w, env = prepare(kind, body, eng.model, eng.n_ctx, chat_template, True)
    if not spec.stream:
        return _whole(env, eng.model, await eng.generate(w.tokens, **w.engine_args()))
    stream = eng.stream(w.tokens, **w.engine_args())

    async def chunks() -> AsyncIterator[Answer]:
        out = ChunkWriter(env, spec.include_usage)
        try:
            for c in out.start():
                yield c
            async for p in stream:
                yield out.piece(p.text, token_logprobs(eng.model, p.tokens, p.logprobs))
            for c in out.end(stream.result):
                yield c
        finally:
            stream.cancel()
    return chunks()
