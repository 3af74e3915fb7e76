"""llama.cpp's own reference tools, built from the pinned tree specdec links, with the same
CPU flags: the fair peer for plain decoding (``llama-bench``), greedy output
(``llama-simple``) and speculative decoding (``llama-speculative-simple``).

``build`` compiles and caches them, ``run`` runs one and returns parsed numbers and text,
``parse`` reads their output. ``python -m specdec.benchmark.llama_tools build`` builds them
ahead of time.
"""
from .build import (DEFAULT_TOOLS, backend_defines, built, cpu_only_flags, ensure_tools, tool,
                    tools_dir)
from .parse import parse_drafts
from .run import run_bench, run_simple, run_simple_timed, run_spec_simple

__all__ = ["DEFAULT_TOOLS", "backend_defines", "built", "cpu_only_flags", "ensure_tools", "parse_drafts",
           "run_bench", "run_simple", "run_simple_timed", "run_spec_simple", "tool", "tools_dir"]
