"""Benchmark prompts; they live in ``specdec.benchmark.prompts`` (package data, so that
``specdec bench`` works from an installed package)."""
from specdec.benchmark.prompts import HERE, Prompt, all_prompts, by_category  # noqa: F401
