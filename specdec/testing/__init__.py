"""Synthetic GGUF models for tests and benchmarks, so nothing has to be downloaded.

write_tiny_qwen35 / write_tiny_dense / write_tiny_mamba2 / write_tiny_qwen3next give
random-weight models (shape and API coverage); write_bigram_mtp_model gives qwen35(moe) models whose greedy output
and MTP acceptance are known, with bigram_successor / mtp_draft_accuracy as
numpy references.
"""

from specdec.testing.bigram import bigram_successor, mtp_draft_accuracy, write_bigram_mtp_model
from specdec.testing.tiny import (
    write_tiny_dense,
    write_tiny_mamba2,
    write_tiny_qwen3next,
    write_tiny_qwen35,
)

__all__ = [
    "bigram_successor",
    "mtp_draft_accuracy",
    "write_bigram_mtp_model",
    "write_tiny_dense",
    "write_tiny_mamba2",
    "write_tiny_qwen3next",
    "write_tiny_qwen35",
]
