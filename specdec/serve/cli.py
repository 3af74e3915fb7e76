"""``specdec serve``: the command line of the HTTP server."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


from ..prompt_cache import DEFAULT_MIB


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from ..cli import _add_decoder_options, _add_model_option

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, "
                       "/v1/chat/completions, /metrics); needs specdec[serve]")
    _add_model_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks one)")
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default $SPECDEC_API_KEY; "
                        "/health stays open)")
    p.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                   help="the name(s) clients use in 'model' (default: the GGUF's file stem)")
    p.add_argument("--chat-template", default=None, metavar="JINJA|NAME|@FILE",
                   help="chat template for /v1/chat/completions (default: the model's own)")
    p.add_argument("--slots", "-np", type=int, default=4,
                   help="requests generated together, verified in one batch per round "
                        "(default 4); more wait in a queue. --n-ctx is per slot")
    p.add_argument("--cache-ram", "-cram", type=float, default=None, metavar="MIB",
                   help="host memory for the KV of prompts whose slot was taken since, restored "
                        "when they come back (default %d MiB; 0: none)" % DEFAULT_MIB)
    _add_decoder_options(p)
    p.add_argument("--verbose", "-v", action="store_true", help="show llama.cpp's log and "
                   "every request")


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


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from . import EngineBackend, create_app
    except ImportError as e:
        print(f"specdec serve needs the serve extra: pip install 'specdec[serve]' ({e})",
              file=sys.stderr)
        return 2
    from ..chat_cli import _template
    from ..cli import _model_path

    path = _model_path(args)
    names = args.served_model_name or [Path(path).stem]
    backend = EngineBackend(engine(path, args))
    app = create_app(backend, names, api_key=args.api_key,
                     chat_template=_template(args.chat_template))
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"specdec serve: WARNING: binding {args.host} without --api-key: anyone who can "
              "reach this port can use the model", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port,
                    log_level="info" if args.verbose else "warning")
    finally:
        backend.close()
    return 0
