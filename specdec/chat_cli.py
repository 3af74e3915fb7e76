"""``specdec chat``: an interactive chat in the terminal, streamed, with a stats line per turn."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

#: the chat's own commands, handled here and never sent to the model
COMMANDS = {"/help": "lists these commands", "/reset": "starts the conversation over",
            "/exit": "leaves (as EOF, Ctrl-D)"}


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from .cli import _add_decoder_options, _add_model_option, _add_sampling_options

    p = sub.add_parser("chat", help="chat with a model in the terminal (its chat template, "
                       "streamed, speculative)",
                       description="Type a message and press Enter; the reply streams as it is "
                       "accepted and a stats line follows. Ctrl-C cuts a reply short. "
                       + " ".join(f"{c} {h}." for c, h in COMMANDS.items()))
    _add_model_option(p)
    p.add_argument("--system", "-s", default=None, help="system message")
    p.add_argument("--chat-template", default=None, metavar="JINJA|NAME|@FILE",
                   help="chat template: Jinja source, a llama.cpp built-in name (chatml, gemma, "
                        "llama3, ...) or @FILE (default: the model's own)")
    p.add_argument("--max-tokens", "-n", type=int, default=512, help="longest reply")
    _add_decoder_options(p)
    _add_sampling_options(p)
    p.add_argument("--verbose", "-v", action="store_true", help="show llama.cpp's log")


def _template(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("@"):
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    return value


def run(args: argparse.Namespace) -> int:
    from .api import Decoder
    from .chat import template_for
    from .cli import _decoder_options, _model_path, _sampling, stats_line

    template = _template(args.chat_template)
    dec = Decoder(_model_path(args), **_decoder_options(args))
    template_for(dec.model, template)   # no template: fail before the first prompt
    sampling = _sampling(args)
    start: List[Dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    tty = sys.stdin.isatty()
    while True:
        if tty:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            return 0
        text = line.rstrip("\n")
        command = text.strip()
        if command.startswith("/") and " " not in command:
            if command == "/exit":
                return 0
            if command == "/reset":
                messages = list(start)
                print("[conversation reset" + (": the system message is kept]" if start else "]"),
                      file=sys.stderr)
            elif command == "/help":
                for c, h in COMMANDS.items():
                    print(f"  {c:8s} {h}", file=sys.stderr)
            else:
                print(f"[unknown command {command}: /help lists them]", file=sys.stderr)
            continue
        if not command:
            continue
        messages.append({"role": "user", "content": text})
        st = dec.stream_chat(messages, max_tokens=args.max_tokens, sampling=sampling,
                             chat_template=template)
        try:
            for piece in st:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            st.close()   # Ctrl-C cuts the reply (finish "cancelled"), not the chat
        res = st.result
        assert res is not None
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(stats_line(res), file=sys.stderr)
        messages.append({"role": "assistant", "content": res.text})
