"""``python -m bench.llama_tools``: kept for existing scripts; the code lives in
``specdec.benchmark.llama_tools`` so that ``specdec bench`` works from an installed package."""
from specdec.benchmark.llama_tools import *  # noqa: F401,F403
from specdec.benchmark.llama_tools import (  # noqa: F401  (private names the scripts use)
    _DRAFT_LEN_FLAG, _RE_DECODED, _RE_ENCODED, _after_prompt, _check, _flag_value, _pin, _stat,
    _tool, main,
)

if __name__ == "__main__":
    raise SystemExit(main())
