"""Benchmark prompts, built from files the repository ships, so every run sees the same text.

Categories:
- ``code``: continue a source file of this repository (frozen copies of their first lines
  in ``prompt_data/``, so editing the sources does not move the baselines);
- ``repeat``: a passage, then the instruction to repeat it verbatim;
- ``records``: structured records (CSV and JSON lines) to continue;
- ``open``: open-ended prose, where lookup drafters have little to copy.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent / "prompt_data"


#: the prompt categories whose text a lookup drafter can copy from (the bench's "best" ratios
#: are taken over them; "open" prompts are continuations without a source)
GROUNDED = ("code", "repeat", "records")


@dataclass(frozen=True)
class Prompt:
    name: str
    category: str
    text: str


def _head(path: Path, n_lines: int) -> str:
    return "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:n_lines])


def _csv(n: int, seed: int) -> str:
    rng = random.Random(seed)
    cities = ["Lisbon", "Oslo", "Quito", "Perth", "Cairo", "Osaka", "Lima", "Riga"]
    rows = ["id,name,city,age,score"]
    for i in range(1, n + 1):
        rows.append(f"{i},user_{i:03d},{rng.choice(cities)},{rng.randint(18, 80)},"
                    f"{rng.randint(0, 100)}")
    return "\n".join(rows) + f"\n{n + 1},"


def _jsonl(n: int, seed: int) -> str:
    rng = random.Random(seed)
    kinds = ["order", "refund", "review"]
    lines = [json.dumps({"id": i, "type": rng.choice(kinds), "amount": rng.randint(1, 500),
                         "currency": "EUR", "status": "ok"}) for i in range(1, n + 1)]
    return "\n".join(lines) + "\n{\"id\": " + str(n + 1) + ","


def all_prompts() -> List[Prompt]:
    passage = (HERE / "passage.txt").read_text(encoding="utf-8")
    return [
        Prompt("code-controller", "code", (HERE / "code_controller.pyx.txt").read_text()),
        Prompt("code-api", "code", (HERE / "code_api.py.txt").read_text()),
        Prompt("code-fetch", "code", (HERE / "code_fetch.py.txt").read_text()),
        Prompt("code-api-head", "code", _head(HERE / "code_api.py.txt", 40)),   # short: quick runs
        Prompt("repeat-passage", "repeat",
               f"Here is a passage.\n\n{passage}\nRepeat the passage above verbatim.\n\n"),
        Prompt("repeat-list", "repeat",
               "Text:\n" + _head(HERE / "code_fetch.py.txt", 14) + "\nThe same text again, word for word:\n"),
        Prompt("records-csv", "records", _csv(40, 1)),
        Prompt("records-jsonl", "records", _jsonl(25, 2)),
        Prompt("open-story", "open", (HERE / "open_ended.txt").read_text(encoding="utf-8")),
        Prompt("open-explain", "open", (HERE / "open_explain.txt").read_text(encoding="utf-8")),
    ]
