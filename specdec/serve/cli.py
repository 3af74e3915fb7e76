"""``specdec serve``: the command line of the HTTP server."""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, List, Optional


from .._template_limits import DEFAULT_LIMITS, TemplateLimits
from ..prompt_cache import DEFAULT_MIB

#: the port ``specdec serve`` binds unless told (not llama-server's 8080 nor vLLM's 8000, so
#: that specdec can run beside either for a comparison); the README's examples use it
DEFAULT_PORT = 8937


def key_problem(key: str) -> Optional[str]:
    """Why ``key`` is no API key a request's header can match (None: it is one). An empty key
    (``--api-key "$KEY"`` with ``KEY`` unset) let in every request that sent ``Bearer `` and
    nothing; one with spaces around it let none in (the header's token is read stripped)."""
    if not key.strip():
        return "the key is empty"
    if key != key.strip() or any(c in key for c in "\r\n"):
        return "the key has spaces around it or a line break"
    return None


def _api_key(value: str) -> str:
    why = key_problem(value)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{why} (from --api-key or $SPECDEC_API_KEY); leave "
                                         "both out to serve without one")
    return value


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from ..cli import _add_decoder_options, _add_model_option

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, "
                       "/v1/chat/completions, /metrics); needs specdec[serve]")
    _add_model_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"), type=_api_key,
                   help="require 'Authorization: Bearer KEY' (default $SPECDEC_API_KEY; "
                        "/health stays open)")
    p.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                   help="the name(s) clients use in 'model' (default: the GGUF's file stem)")
    p.add_argument("--chat-template", default=None, metavar="JINJA|NAME|@FILE",
                   help="chat template for /v1/chat/completions (default: the model's own)")
    p.add_argument("--chat-template-timeout", type=float, default=DEFAULT_LIMITS.seconds,
                   metavar="S", help="seconds a chat template may take to render one request "
                   "(default %(default)s; 0: no limit); past it the request gets a 400")
    p.add_argument("--chat-template-max-chars", type=int, default=DEFAULT_LIMITS.max_chars,
                   metavar="N", help="the longest text (or list) a chat template may build, its "
                   "output included (default %(default)s); past it the request gets a 400")
    p.add_argument("--slots", "-np", type=int, default=4,
                   help="requests generated together, verified in one batch per round "
                        "(default 4); more wait in a queue. --n-ctx is per slot")
    p.add_argument("--cache-ram", "-cram", type=float, default=None, metavar="MIB",
                   help="host memory for the KV of prompts whose slot was taken since, restored "
                        "when they come back (default %d MiB; 0: none)" % DEFAULT_MIB)
    _add_decoder_options(p)
    p.add_argument("--verbose", "-v", action="store_true", help="show llama.cpp's log (the "
                   "startup banner and one access-log line per request show without it)")


def engine(path: str, args: argparse.Namespace) -> Any:
    """The Engine of ``specdec serve``'s options: the drafters given (their chain is the
    default; a request may name one of them, or ``plain``), ``--slots`` of ``--n-ctx`` each."""
    from ..cli import _decoder_options
    from ..engine import Engine

    opts = _decoder_options(args)
    if opts.pop("n_gpu_layers_draft") is not None:
        raise ValueError("--n-gpu-layers-draft is not available in specdec serve")
    drafters = opts.pop("drafter") or []
    cache = DEFAULT_MIB if args.cache_ram is None else args.cache_ram
    return Engine(path, drafters=drafters, default_drafter=drafters if len(drafters) > 1 else None,
                  n_slots=args.slots, prompt_cache_mib=cache, **opts)


def _address(host: str, port: int) -> Any:
    """``host:port`` resolved for a listening socket; a ``ValueError`` naming the flag for a
    port out of range or a host that does not resolve (checked before the model loads)."""
    if not 0 <= port <= 65535:
        # getaddrinfo takes 99999 as 34463 (modulo 2**16) and -1 as an error of its own
        raise ValueError(f"--port must be in 0..65535 (0 picks a free one), got {port}")
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--host {host!r} is not an address to listen on: "
                         f"{getattr(e, 'strerror', None) or e}") from None


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), bound before the banner so
    that the banner names the real port and a request sent after it is queued."""
    family, kind, proto, _, addr = _address(host, port)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def banner(url: str, names: List[str], path: str, eng: Any) -> str:
    """The startup line: where to send requests, and what answers them."""
    drafters = ", ".join(eng.drafters) or "none (plain decoding)"
    return (f"specdec serve: listening on {url} (OpenAI API at {url}/v1) | model "
            f"{', '.join(names)} ({path}) | drafters: {drafters} | {eng.n_slots} slots of "
            f"{eng.n_ctx} tokens")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from . import EngineBackend, create_app
        from .app import ACCESS_LOG
        from .limits import SWITCH_INTERVAL_S
    except ImportError as e:
        print(f"specdec serve needs the serve extra: pip install 'specdec[serve]' ({e})",
              file=sys.stderr)
        return 2
    from ..chat import ChatTemplate
    from ..chat_cli import _template
    from ..cli import _model_path

    _address(args.host, args.port)     # a bad --host or --port before the model loads
    limits = TemplateLimits(seconds=args.chat_template_timeout,
                            max_chars=args.chat_template_max_chars)
    template = _template(args.chat_template)
    if template is not None:
        # compiled here, before the model loads: a --chat-template that is neither a
        # built-in name nor Jinja that compiles started a server whose every chat was a 400
        ChatTemplate(template, limits=limits)
    path = _model_path(args)
    names = args.served_model_name or [Path(path).stem]
    # the event loop waits for the GIL behind the workers' templates (see limits.py)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    backend = EngineBackend(engine(path, args))
    app = create_app(backend, names, api_key=args.api_key, chat_template=template,
                     template_limits=limits)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"specdec serve: WARNING: binding {args.host} without --api-key: anyone who can "
              "reach this port can use the model", file=sys.stderr)
    # the access log: one INFO line per request (see app.Server._endpoint)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    access = logging.getLogger(ACCESS_LOG)
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
    try:
        sock = _listen(args.host, args.port)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(banner(f"http://{shown}:{port}", names, path, backend.engine), file=sys.stderr,
              flush=True)
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        app.state.server.off_loop.close()
        backend.close()
    return 0
