"""What one request body may make the server do, and the work kept off the event loop.

Why: the event loop answers every client (``/health`` and ``/metrics`` included). A body
under the size limit can still cost seconds of Python: ``[`` nested 100,000 deep makes the
JSON parser raise ``RecursionError``, 20,000 tiny messages make a chat template loop for a
minute, and the tokenizer then reads what the template wrote. So a body is parsed, and a
chat rendered and tokenized, on worker threads (:class:`OffLoop`), each step bounded:

- the body: at most ``MAX_BODY`` bytes, ``MAX_JSON_VALUES`` values and ``MAX_JSON_MEMBERS``
  object members (413), nested at most ``MAX_JSON_DEPTH`` deep (400);
- the chat: at most ``MAX_MESSAGES`` messages (400); the template's time and output size are
  bounded by :class:`specdec.chat.TemplateLimits` (``--chat-template-timeout``,
  ``--chat-template-max-chars``), a failure is a 400.

Every refusal is an :class:`~specdec.serve.protocol.APIError` in OpenAI's shape, with a
message written for the client.

The workers hold the GIL while they run Python (a template) or parse JSON; ``specdec serve``
sets the interpreter's switch interval to ``SWITCH_INTERVAL_S`` (Python's default is 5 ms)
so that the event loop, which needs the GIL a few times per request, waits at most that long
each time.
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, TypeVar

from .protocol import APIError, bad

#: the largest request body read (bytes)
MAX_BODY = 8 << 20
#: the deepest nesting of arrays and objects in a body
MAX_JSON_DEPTH = 64
#: the most separators (``,`` ``:`` ``[`` ``{``, strings' included) in a body: Python's JSON
#: parser holds the GIL for the whole body, and a million tiny values would hold it (and the
#: event loop) for a quarter of a second; a text with this many separators is more tokens
#: than a context holds anyway
MAX_JSON_VALUES = 1 << 18
#: the most object members (``:``, strings' included): an object costs the parser several
#: times what a number in an array does; 16,384 hold MAX_MESSAGES messages of a few fields
MAX_JSON_MEMBERS = 1 << 14
#: the most messages in one chat request
MAX_MESSAGES = 4096
#: threads that parse bodies and render and tokenize prompts
WORKERS = 2
#: the GIL switch interval of the server's process (seconds)
SWITCH_INTERVAL_S = 0.001

T = TypeVar("T")


def json_depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value, walked without recursion; stops counting
    past ``limit``."""
    deepest = 0
    stack: List[tuple] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def parse_body(data: bytes) -> Any:
    """A request body as JSON, or a 400/413 that says why not (invalid, nested too deeply,
    too many values)."""
    members = data.count(b":")
    n = members + sum(data.count(c) for c in (b",", b"[", b"{"))
    if n > MAX_JSON_VALUES or members > MAX_JSON_MEMBERS:
        raise APIError(413, f"the request body has over {MAX_JSON_VALUES} JSON values or "
                       f"{MAX_JSON_MEMBERS} object members", code="body_too_large")
    try:
        value = json.loads(data)
    except RecursionError:
        raise bad(f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} levels "
                  "of arrays and objects)", code="body_too_deep") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise bad(f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} levels "
                  "of arrays and objects)", code="body_too_deep")
    return value


def check_messages(messages: Any) -> None:
    """The message count of a chat body (the rest is checked when the template renders)."""
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        raise bad(f"'messages' has {len(messages)} entries; this server takes at most "
                  f"{MAX_MESSAGES}", "messages", code="too_many_messages")


def body_too_large() -> APIError:
    return APIError(413, f"request body over {MAX_BODY} bytes", code="body_too_large")


class OffLoop:
    """Worker threads for a request's CPU work, so that the event loop stays free."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None
        self._workers = workers

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="specdec-request")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
