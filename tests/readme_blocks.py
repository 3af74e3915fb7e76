"""The fenced code blocks of README.md, for the tests that run and type-check them.

A block is skipped only when the line right before its fence is a marker comment
``<!-- readme-test: skip (why) -->``, visible in the README's source.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

README = Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^```(\w*)\s*$")
_SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((.+)\)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int                 # 1-based line of the opening fence
    code: str
    skip: Optional[str]       # the marker's reason, if the block is marked

    @property
    def id(self) -> str:
        return f"{self.lang}-L{self.line}"


def blocks(path: Path = README) -> List[Block]:
    lines = path.read_text().splitlines()
    out: List[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        prev = _SKIP.match(lines[i - 1]) if i > 0 else None
        out.append(Block(m.group(1), i + 1, "\n".join(lines[i + 1:j]) + "\n",
                         prev.group(1) if prev else None))
        i = j + 1
    return out


def runnable(lang: str) -> List[Block]:
    return [b for b in blocks() if b.lang == lang]
