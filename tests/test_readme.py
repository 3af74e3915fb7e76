"""Every Python and shell block of the README runs as written on the default model."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import README, blocks, runnable

if not README.exists():
    pytest.skip("no README.md next to the tests", allow_module_level=True)

BIN = str(Path(sys.executable).parent)


def _env():
    # the interpreter and the `specdec` command of this environment come first
    return {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}


def _run(argv, tmp_path):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=_env())
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    return p


@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.id)
def test_python_block(block, tmp_path, gemma_path):
    if block.skip:
        pytest.skip(block.skip)
    script = tmp_path / "example.py"
    script.write_text(block.code)
    p = _run([sys.executable, str(script)], tmp_path)
    if "@register" in block.code:   # the custom drafter must draft, and be accepted, on this model
        m = re.search(r"drafted (\d+), accepted (\d+)", p.stdout)
        assert m, p.stdout
        assert int(m.group(1)) > 0 and int(m.group(2)) > 0, m.group(0)


@pytest.mark.parametrize("block", runnable("bash"), ids=lambda b: b.id)
def test_shell_block(block, tmp_path, gemma_path):
    if block.skip:
        pytest.skip(block.skip)
    script = tmp_path / "example.sh"
    script.write_text("set -euo pipefail\n" + block.code)
    _run(["bash", str(script)], tmp_path)


def test_the_blocks_are_found_and_few_are_skipped():
    all_ = blocks()
    assert len(runnable("python")) >= 2 and len(runnable("bash")) >= 2
    skipped = [b for b in all_ if b.skip]
    assert len(skipped) <= 5, [b.id for b in skipped]
    # a marker must sit right before a fence, or it silently marks nothing
    lines = README.read_text().splitlines()
    marks = [i for i, line in enumerate(lines, 1) if line.startswith("<!-- readme-test:")]
    assert sorted(b.line - 1 for b in skipped) == marks
    # every block is Python, shell, or a config format that has nothing to run
    assert {b.lang for b in all_} <= {"python", "bash", "toml", "yaml", ""}
