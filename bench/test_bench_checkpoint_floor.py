"""The checkpoint-rollback floor: a drafter that is never right, on a target rolled back by
checkpoints (the mid Mamba-2 of ``specdec.benchmark.synthetic``), under the adaptive policy,
timed round by round in turn with plain decoding (``specdec.benchmark.interleave``).

Every verify with drafts saves the recurrent state and every one is rejected: restore, decode
again. The policy must charge that to drafting and stop asking (probing now and then), so the
ratio stays >= 0.97. A fixed ``n_max`` shows what the policy avoids (recorded, not asserted).
"""
from typing import List

import pytest

import specdec
from specdec.benchmark import synthetic
from specdec.benchmark.interleave import interleave

N_GEN = 256
N_MAX = 4
PROMPT = list(range(100, 164))


class NeverRight(specdec.Drafter):
    """Drafts the tokens after ``last`` in id order: a random model never continues so."""

    def __init__(self, n_vocab: int) -> None:
        super().__init__("never-right")
        self.vocab = n_vocab

    def propose(self, seq: int, last_token: int, n_max: int) -> List[int]:
        return [(last_token + 1 + i) % self.vocab for i in range(n_max)]


@pytest.fixture(scope="module")
def mamba2():
    return specdec.Model(str(synthetic.mid_mamba2()))


@pytest.mark.parametrize("adaptive,requests", [(True, 10), (False, 2)],
                         ids=["adaptive", f"fixed-n{N_MAX}"])
def test_never_right_drafter(benchmark, mamba2, adaptive, requests):
    n_vocab = synthetic.MID_MAMBA2.n_vocab
    plain = specdec.Decoder(mamba2, n_ctx=2048, n_threads=2)
    dec = specdec.Decoder(mamba2, drafter=NeverRight(n_vocab), n_max=N_MAX, adaptive=adaptive,
                          n_ctx=2048, n_threads=2)
    r = benchmark.pedantic(interleave, args=(dec, plain, PROMPT, N_GEN, requests),
                           rounds=1, iterations=1)
    ratio = r.tok_s / r.ref_tok_s
    per = r.per_request()
    benchmark.extra_info.update({"ratio": ratio, "per_request": per, "drafted": r.drafted,
                                 "accepted": r.accepted})
    print(f"\nnever-right drafter, {'adaptive' if adaptive else f'fixed n_max={N_MAX}'}: "
          f"{r.tok_s:.1f} tok/s, plain {r.ref_tok_s:.1f} tok/s, ratio {ratio:.3f} "
          f"(per request {min(per):.3f}-{max(per):.3f}), drafted {r.drafted}")
    assert r.same_tokens and r.accepted == 0 and r.drafted > 0
    if adaptive:
        assert ratio >= 0.97
