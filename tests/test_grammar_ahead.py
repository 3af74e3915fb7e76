"""Masks computed ahead of a grammar's state (``GrammarState.whole_ahead``, which classes the
rows of a draft by how much of the head they need) serve those rows when the verification
keeps the drafts they follow, instead of being computed a second time; a path the output
leaves is dropped. Each row's mask must be what a state that never looked ahead computes."""
from __future__ import annotations

import numpy as np
import pytest

from specdec import Constraint, Decoder

pytest.importorskip("llguidance")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "city": {"enum": ["Lyon", "Basel", "Turin"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPT = "Extract the person as JSON.\nText: Alice Martin, 34, lives in Lyon.\nJSON: "
EVERYTHING_WHOLE = 1 << 30      # sparse_head: every row counts as whole, so none stops the look


def test_masks_computed_ahead_are_reused_and_equal_fresh_ones(gemma):
    toks = Decoder(gemma, n_ctx=512).generate(PROMPT, max_tokens=64, json_schema=SCHEMA).tokens
    grammar = Constraint(json_schema=SCHEMA).compile(gemma)
    looked, fresh = grammar.state(), grammar.state()
    zeros = np.zeros(gemma.n_vocab, dtype=np.float32)
    eos = set(gemma.eog_tokens)
    body = [t for t in toks if t not in eos]
    assert len(body) > 8
    for i, t in enumerate(body):
        if i % 5 == 0:
            # look ahead along the output; every third look along a path it leaves at once
            path = body[i:i + 6] if i % 3 else [body[i]] + body[i + 2:i + 6]
            looked.look_ahead(path, EVERYTHING_WHOLE)
        np.testing.assert_array_equal(looked.mask(zeros.copy()), fresh.mask(zeros.copy()))
        looked.advance(t)
        fresh.advance(t)
    np.testing.assert_array_equal(looked.mask(zeros.copy()), fresh.mask(zeros.copy()))
    assert looked.n_masks == fresh.n_masks
    assert fresh.n_reused == 0 and looked.n_reused > len(body) // 3
    assert looked.error is None and fresh.error is None

