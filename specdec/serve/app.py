"""The ASGI app: OpenAI's completions and chat endpoints, models, health and metrics.

Every error is answered in OpenAI's error shape with its status (400 bad body, 401 bad key,
404 unknown model or path, 413 body or prompt too long); an error inside a generation ends
that request only. A stream whose client goes away is cancelled, which frees its slot at the
next round.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Tuple

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import _request
from .._core import ContextFullError
from ..chat import TemplateLimits
from .backend import Job, Piece
from .cli import key_problem
from .limits import MAX_BODY, OffLoop, body_too_large, check_messages, parse_body
from .metrics import Metrics
from .protocol import (APIError, Chunks, Envelope, Spec, bad, chat_spec, completion_spec,
                       full_response, requests)

#: the logger of the access log: one INFO line per request (``specdec serve`` shows it)
ACCESS_LOG = "specdec.serve.access"
_access = logging.getLogger(ACCESS_LOG)
#: how often a non-streaming request checks that its client is still there (seconds)
DISCONNECT_POLL_S = 0.25


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _sse(obj: Dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Server:
    """The handlers, bound to one backend, its model's names and the server's options."""

    def __init__(self, backend: Any, model_names: List[str], *, api_key: Optional[str] = None,
                 chat_template: Optional[str] = None,
                 template_limits: TemplateLimits = TemplateLimits()) -> None:
        self.backend = backend
        self.models = model_names
        why = None if api_key is None else key_problem(api_key)
        if why is not None:
            raise ValueError(f"api_key: {why} (None: serve without a key)")
        self.api_key = api_key
        self.chat_template = chat_template
        self.template_limits = template_limits
        self.off_loop = OffLoop()   # body parsing, chat rendering and tokenization
        self.metrics = Metrics(backend)
        self.started = int(time.time())

    # --- plumbing -----------------------------------------------------------------------

    def _auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ")
                and hmac.compare_digest(given[7:].strip().encode(), self.api_key.encode())):
            raise APIError(401, "Incorrect or missing API key (Authorization: Bearer KEY)",
                           code="invalid_api_key")

    async def _body(self, request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY:
            raise body_too_large()
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > MAX_BODY:
                raise body_too_large()
        return await self.off_loop.run(parse_body, bytes(data))

    def _endpoint(self, name: str, handler: Callable[[Request], Awaitable[Response]]
                  ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            t0 = time.monotonic()
            try:
                if name != "health":
                    self._auth(request)
                resp = await handler(request)
            except APIError as e:
                resp = _error(e)
            self.metrics.requests.labels(name, str(resp.status_code)).inc()
            if _access.isEnabledFor(logging.INFO):
                # a stream's line comes when its headers go out, before its body
                client = request.client
                _access.info('%s "%s %s" %d %.0f ms%s', client.host if client else "-",
                             request.method, request.url.path, resp.status_code,
                             (time.monotonic() - t0) * 1e3,
                             " (stream)" if isinstance(resp, StreamingResponse) else "")
            return resp
        return run

    def routes(self) -> List[Route]:
        return [
            Route("/health", self._endpoint("health", self.health), methods=["GET"]),
            Route("/metrics", self._endpoint("metrics", self.metrics_text), methods=["GET"]),
            Route("/v1/models", self._endpoint("models", self.list_models), methods=["GET"]),
            Route("/v1/models/{model:path}", self._endpoint("models", self.get_model),
                  methods=["GET"]),
            Route("/v1/completions", self._endpoint("completions", self.completions),
                  methods=["POST"]),
            Route("/v1/chat/completions", self._endpoint("chat", self.chat), methods=["POST"]),
        ]

    # --- endpoints ------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        st = self.backend.stats()
        return JSONResponse({"status": "ok", "slots": st["slots"], "running": st["running"],
                             "queued": st["queued"]})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_card(self, name: str) -> Dict[str, Any]:
        return {"id": name, "object": "model", "created": self.started, "owned_by": "specdec"}

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card(m) for m in self.models]})

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self.models:
            raise APIError(404, f"The model '{name:.200}' does not exist", param="model",
                           code="model_not_found")
        return JSONResponse(self._model_card(name))

    async def completions(self, request: Request) -> Response:
        # announced to the engine from here: requests that arrive together start together
        with self.backend.arriving() as arrival:
            return await self._generate(request, completion_spec(await self._body(request),
                                                                 self.models), arrival)

    async def chat(self, request: Request) -> Response:
        with self.backend.arriving() as arrival:
            body = await self._body(request)
            if isinstance(body, dict):
                check_messages(body.get("messages"))
            return await self._generate(request, chat_spec(body, self.models), arrival)

    # --- generation -------------------------------------------------------------------------

    def _requests(self, spec: Spec) -> List[_request.Request]:
        """The requests of ``spec``, one per choice, checked by the engine's core (off the
        event loop: the template, the tokenizer and a constraint's compilation take time);
        a refused field is a 400 naming it."""
        try:
            self.backend.check_options(spec.options)
        except (ValueError, TypeError) as e:
            raise bad(str(e), "specdec") from None
        try:
            return requests(spec, self.backend.core, self.chat_template, self.template_limits)
        except ImportError as e:
            raise bad(str(e), spec.constraint_field) from None
        except (ValueError, TypeError) as e:
            raise bad(str(e), spec.constraint_field if spec.constraint
                      else "specdec" if spec.options else None) from None

    async def _generate(self, request: Request, spec: Spec, arrival: Any) -> Response:
        todo = await self.off_loop.run(self._requests, spec)
        arrived = time.monotonic()
        jobs: List[Job] = []
        try:
            for req in todo:          # one job per choice; they run together on the engine
                jobs.append(self.backend.submit(req))
        except BaseException:
            for job in jobs:
                job.cancel()
            raise
        finally:
            arrival.done()            # submitted: the engine need not wait for it
        env = Envelope(spec.kind, spec.model)
        if spec.stream:
            return StreamingResponse(self._events(jobs, env, spec, arrived),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._whole(request, jobs, env, spec, arrived)

    async def _whole(self, request: Request, jobs: List[Job], env: Envelope, spec: Spec,
                     arrived: float) -> Response:
        task = asyncio.ensure_future(asyncio.gather(*(self._drain(j, arrived) for j in jobs)))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    for job in jobs:
                        job.cancel()
            results = task.result()
        except asyncio.CancelledError:
            for job in jobs:
                job.cancel()
            raise
        except (ValueError, TypeError) as e:
            raise bad(str(e)) from None
        except Exception as e:
            raise APIError(500, f"generation failed: {type(e).__name__}: {e}",
                           type="server_error") from None
        finally:
            for job in jobs:
                job.cancel()        # a choice failed: the others leave too (harmless if done)
        lps = [self.backend.logprobs_of(r.tokens, r.logprobs) for r in results]
        return JSONResponse(full_response(env, results, lps, spec.tool_format))

    async def _pieces(self, job: Job, arrived: float) -> AsyncIterator[Piece]:
        """The job's pieces, counted for the time to first token and the token rate."""
        n = 0
        async for piece in job:
            if n == 0:
                self.metrics.ttft.observe(time.monotonic() - arrived)
            self.metrics.tokens(piece.n_tokens - n)
            n = piece.n_tokens
            yield piece

    async def _drain(self, job: Job, arrived: float) -> Any:
        async for _ in self._pieces(job, arrived):
            pass
        return job.result

    async def _merged(self, jobs: List[Job], arrived: float
                      ) -> AsyncIterator[Tuple[int, Optional[Piece]]]:
        """The choices' pieces as they come, as ``(index, piece)``; ``(index, None)`` when
        choice ``index`` ends. An error in any choice is raised here."""
        if len(jobs) == 1:            # the common case, without tasks
            async for piece in self._pieces(jobs[0], arrived):
                yield 0, piece
            yield 0, None
            return
        queue: "asyncio.Queue[Tuple[int, Any]]" = asyncio.Queue()

        async def feed(i: int, job: Job) -> None:
            try:
                async for piece in self._pieces(job, arrived):
                    await queue.put((i, piece))
                await queue.put((i, None))
            except Exception as e:
                await queue.put((i, e))
        tasks = [asyncio.ensure_future(feed(i, j)) for i, j in enumerate(jobs)]
        try:
            for _ in range(len(jobs)):
                while True:
                    i, item = await queue.get()
                    if isinstance(item, Exception):
                        raise item
                    yield i, item
                    if item is None:
                        break
        finally:
            for t in tasks:
                t.cancel()

    async def _events(self, jobs: List[Job], env: Envelope, spec: Spec, arrived: float
                      ) -> AsyncIterator[str]:
        chunks = Chunks(env, spec.include_usage, len(jobs), spec.tool_format)
        try:
            for c in chunks.start():
                yield _sse(c)
            try:
                async for i, piece in self._merged(jobs, arrived):
                    if piece is not None:
                        for c in chunks.piece(i, piece.text, piece.logprobs):
                            yield _sse(c)
                        continue
                    res = jobs[i].result
                    assert res is not None
                    for c in chunks.end(i, res):
                        yield _sse(c)
            except (ValueError, TypeError, ContextFullError) as e:
                yield _sse(bad(str(e)).body())
                yield "data: [DONE]\n\n"
                return
            except Exception as e:
                yield _sse(APIError(500, f"generation failed: {type(e).__name__}: {e}",
                                    type="server_error").body())
                yield "data: [DONE]\n\n"
                return
            for c in chunks.usage([r for r in (j.result for j in jobs) if r is not None]):
                yield _sse(c)
            yield "data: [DONE]\n\n"
        finally:
            for job in jobs:
                job.cancel()    # a client gone mid-stream: the slots are freed at the next round


def create_app(backend: Any, model_names: List[str], *, api_key: Optional[str] = None,
               chat_template: Optional[str] = None,
               template_limits: TemplateLimits = TemplateLimits()) -> Starlette:
    """The server as an ASGI app (run it with uvicorn, or ``specdec serve``)."""
    server = Server(backend, model_names, api_key=api_key, chat_template=chat_template,
                    template_limits=template_limits)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return _error(APIError(exc.status_code, str(exc.detail), code=code))

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(APIError(500, f"{type(exc).__name__}: {exc}", type="server_error"))

    app = Starlette(routes=server.routes(),
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.server = server
    return app
