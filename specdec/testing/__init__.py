"""Synthetic GGUF models for tests and benchmarks, so nothing has to be downloaded.

write_tiny_qwen35 / write_tiny_dense / write_tiny_mamba2 / write_tiny_qwen3next /
write_tiny_rwkv7 / write_tiny_gemma3 (sliding-window attention) give random-weight models
(shape and API coverage); write_bigram_mtp_model
gives qwen35(moe) and qwen3next models whose greedy output
and MTP acceptance are known, with bigram_successor / mtp_draft_accuracy as
numpy references; write_eagle3_draft gives EAGLE-3 drafts of those targets with a
dialled acceptance, with eagle3_draft_accuracy as its numpy reference; write_dflash_draft gives
DFlash drafts of periodic bigram targets (``write_bigram_mtp_model(period=T)``) with an exact
acceptance dial, with dflash_drafts as its numpy reference. ``vocabs`` writes
one letter language under several vocabularies (drafts across tokenizers); ``chat`` writes tiny models with chat templates, ``gguf_fuzz`` fuzzes
model loading (``python -m specdec.testing.gguf_fuzz``).

Tooling, like ``numpy.testing``: for specdec's tests and a user's own; it imports the
runtime, and the runtime never imports it (``tests/test_layout.py``).
"""

from specdec.testing.bigram import bigram_successor, mtp_draft_accuracy, write_bigram_mtp_model
from specdec.testing.dflash import dflash_drafts, write_dflash_draft
from specdec.testing.eagle3 import eagle3_draft_accuracy, write_eagle3_draft
from specdec.testing.tiny import (
    write_tiny_dense,
    write_tiny_gemma3,
    write_tiny_mamba2,
    write_tiny_qwen3next,
    write_tiny_qwen35,
)
from specdec.testing.rwkv7 import write_tiny_rwkv7

__all__ = [
    "bigram_successor",
    "dflash_drafts",
    "eagle3_draft_accuracy",
    "mtp_draft_accuracy",
    "write_bigram_mtp_model",
    "write_dflash_draft",
    "write_eagle3_draft",
    "write_tiny_dense",
    "write_tiny_gemma3",
    "write_tiny_mamba2",
    "write_tiny_qwen3next",
    "write_tiny_qwen35",
    "write_tiny_rwkv7",
]
