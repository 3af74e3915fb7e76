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
from typing import (Any, AsyncIterator, Dict, Iterator, List, Literal, Mapping, Optional,
                    Sequence, Tuple, Union, overload)

from ._core import ContextFullError
from ._request import Request
from .handles import RequestHandle

Answer = Dict[str, Any]
Chunks = Iterator[Answer]
Prompt = Union[str, Sequence[int]]
Messages = Sequence[Mapping[str, Any]]


class CompletionMethods:
    """``create_completion`` / ``create_chat_completion`` of :class:`~specdec.Decoder` and
    :class:`~specdec.Engine`: ``request`` is the rest of the request body (``max_tokens``,
    ``temperature``, ``stop``, ``logprobs``, ``n``, ...), the answer the dict ``specdec
    serve`` returns (an iterator of chunk dicts with ``stream=True``); ``chat_template``:
    Jinja source or a llama.cpp built-in name, instead of the model's own. A class using
    this defines ``_openai_call``."""

    def _openai_call(self, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                     ) -> Union[Answer, Chunks]:
        raise NotImplementedError

    @overload
    def create_completion(self, prompt: Prompt, *, stream: Literal[False] = False,
                          **request: Any) -> Answer: ...

    @overload
    def create_completion(self, prompt: Prompt, *, stream: Literal[True],
                          **request: Any) -> Chunks: ...

    def create_completion(self, prompt: Prompt, *, stream: bool = False,
                          **request: Any) -> Union[Answer, Chunks]:
        """``/v1/completions`` in Python: OpenAI's ``text_completion``."""
        return self._openai_call("completion", dict(request, prompt=prompt, stream=stream), None)

    @overload
    def create_chat_completion(self, messages: Messages, *, chat_template: Optional[str] = None,
                               stream: Literal[False] = False, **request: Any) -> Answer: ...

    @overload
    def create_chat_completion(self, messages: Messages, *, chat_template: Optional[str] = None,
                               stream: Literal[True], **request: Any) -> Chunks: ...

    def create_chat_completion(self, messages: Messages, *, chat_template: Optional[str] = None,
                               stream: bool = False, **request: Any) -> Union[Answer, Chunks]:
        """``/v1/chat/completions`` in Python: OpenAI's ``chat.completion``."""
        return self._openai_call("chat", dict(request, messages=list(messages), stream=stream),
                                 chat_template)


def _python_error(e: Any) -> Exception:
    """The server's ``APIError`` as the exception a Python caller expects."""
    if e.status == 413:
        return ContextFullError(e.message)
    return ValueError(e.message)


def prepare(kind: str, body: Dict[str, Any], front: Any, chat_template: Optional[str],
            options_ok: bool) -> Tuple[Any, List[Request], Any]:
    """``(spec, requests, envelope)`` of a request body on the front door ``front`` (a
    request per choice, built by its scheduler core), checked as the server checks it."""
    from .serve.protocol import (APIError, EXTENSION, EXTENSION_OPTIONS, Envelope, chat_spec,
                                 completion_spec, requests)
    name = Path(front.model.path or "model").stem
    try:
        spec = (chat_spec if kind == "chat" else completion_spec)(body, [name])
        if spec.options and not options_ok:
            raise APIError(400, f"the '{EXTENSION}' request options "
                           f"({', '.join(EXTENSION_OPTIONS)}) need an Engine", param=EXTENSION)
        todo = requests(spec, front._core, chat_template)
    except APIError as e:
        raise _python_error(e) from None
    return spec, todo, Envelope(spec.kind, spec.model)


def _whole(env: Any, spec: Any, model: Any, results: List[Any]) -> Answer:
    from .serve.protocol import full_response, token_logprobs
    return full_response(env, results, [token_logprobs(model, r.tokens, r.logprobs)
                                        for r in results], spec.tool_format)


def _chunks(env: Any, spec: Any, model: Any, streams: List[Tuple[Iterator[Any], Any]]) -> Chunks:
    """The chunks of the choices' streams, one choice after the other; each stream is
    ``(pieces, result)``, ``result()`` giving its finished result after its pieces."""
    from .serve.protocol import Chunks as ChunkWriter, token_logprobs
    out = ChunkWriter(env, spec.include_usage, len(streams), spec.tool_format)
    yield from out.start()
    results = []
    for i, (pieces, result) in enumerate(streams):
        for p in pieces:
            yield from out.piece(i, p.text, token_logprobs(model, p.tokens, p.logprobs))
        results.append(result())
        yield from out.end(i, results[-1])
    yield from out.usage(results)


def decoder_call(dec: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                 ) -> Union[Answer, Chunks]:
    """A request on a :class:`~specdec.Decoder`: its choices one after the other."""
    spec, todo, env = prepare(kind, body, dec, chat_template, False)
    if not spec.stream:
        return _whole(env, spec, dec.model, [dec._run([r])[0] for r in todo])

    def chunks() -> Chunks:
        from .serve.protocol import Chunks as ChunkWriter, token_logprobs
        out = ChunkWriter(env, spec.include_usage, len(todo), spec.tool_format)
        yield from out.start()
        results = []
        for i, r in enumerate(todo):
            st = dec._open(r)
            try:
                for p in st.pieces():
                    yield from out.piece(i, p.text,
                                         token_logprobs(dec.model, p.tokens, p.logprobs))
            finally:
                st.close()      # abandoned half-way: the Decoder is free again
            results.append(st.result)
            yield from out.end(i, st.result)
        yield from out.usage(results)
    return chunks()


def engine_call(eng: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                ) -> Union[Answer, Chunks]:
    """A request on an :class:`~specdec.Engine`, waited for in this thread (its choices run
    together)."""
    spec, todo, env = prepare(kind, body, eng, chat_template, True)
    handles = []
    try:
        for r in todo:
            handles.append(RequestHandle(eng._enqueue(r)))
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    if not spec.stream:
        try:
            return _whole(env, spec, eng.model, [h.result() for h in handles])
        finally:
            for h in handles:
                h.cancel()

    def chunks() -> Chunks:
        try:
            yield from _chunks(env, spec, eng.model, [(h.pieces(), h.result) for h in handles])
        finally:
            for h in handles:
                h.cancel()      # abandoned half-way: the slots are freed at the next round
    return chunks()


async def engine_acall(eng: Any, kind: str, body: Dict[str, Any], chat_template: Optional[str]
                       ) -> Union[Answer, AsyncIterator[Answer]]:
    """A request on an :class:`~specdec.Engine` from asyncio (its choices run together)."""
    import asyncio

    from .serve.protocol import Chunks as ChunkWriter, token_logprobs
    spec, todo, env = prepare(kind, body, eng, chat_template, True)
    if not spec.stream:
        states = [eng._enqueue(r) for r in todo]
        try:
            results = await asyncio.gather(*(eng._wait(st) for st in states))
        finally:
            for st in states:          # one choice failed (or the caller was cancelled):
                st.cancel()            # the others stop too; a finished one is not touched
        return _whole(env, spec, eng.model, list(results))
    streams = [eng._stream(r) for r in todo]

    async def chunks() -> AsyncIterator[Answer]:
        out = ChunkWriter(env, spec.include_usage, len(streams), spec.tool_format)
        try:
            for c in out.start():
                yield c
            for i, stream in enumerate(streams):   # in order; they run together meanwhile
                async for p in stream:
                    for c in out.piece(i, p.text,
                                       token_logprobs(eng.model, p.tokens, p.logprobs)):
                        yield c
                for c in out.end(i, stream.result):
                    yield c
            for c in out.usage([st.result for st in streams]):
                yield c
        finally:
            for stream in streams:
                stream.cancel()
    return chunks()
