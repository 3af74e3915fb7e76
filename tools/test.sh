#!/usr/bin/env bash
# Set up and run the whole test suite: build and install specdec from this tree
# (fetching the pinned llama.cpp), then run pytest against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --disable-pip-version-check -q '.[test]'
# run from the repo root with the `pytest` entry point (not `python -m pytest`), so that
# `import specdec` finds the installed, compiled package and not the source folder
exec pytest "$@"
