"""The checkpoint-rollback floor: a drafter that is never right, on a target rolled back by
checkpoints, under the adaptive policy, against plain decoding, timed round by round in
turn (``specdec.benchmark.interleave``, as the MTP floor is).

The target is a random "mid" Mamba-2 (vocab 8192, n_embd 512, 8 layers, Q8_0), written
once into the specdec cache dir. Every verify with drafts saves the recurrent state, and
every one is rejected: restore, decode again. The policy must charge that to drafting and
stop asking (probing now and then), so the ratio stays >= 0.97. A fixed ``n_max`` run
shows what the policy avoids.

    python -m bench.checkpoint_floor                      # 10 requests of 256 tokens
    python -m bench.checkpoint_floor --requests 4 --n-gen 128
"""
from __future__ import annotations

import argparse
from typing import List

import specdec
from specdec import Decoder
from specdec.benchmark.interleave import interleave
from specdec.cache import cache_dir
from specdec.drafters import Drafter
from specdec.testing.tiny import Mamba2Dims, add_mamba2_kv, mamba2_layout, write_random

MID = Mamba2Dims(n_vocab=8192, n_embd=512, n_layer=8, d_inner=1024, d_state=64, n_head=16)


class NeverRight(Drafter):
    """Drafts the tokens after ``last`` in id order: a random model never continues so."""

    def __init__(self, n_vocab: int) -> None:
        super().__init__("never-right")
        self.n_vocab = n_vocab

    def propose(self, seq: int, last_token: int, n_max: int) -> List[int]:
        return [(last_token + 1 + i) % self.n_vocab for i in range(n_max)]


def mid_mamba2() -> str:
    path = cache_dir() / "bench-mamba2-mid-q8_0.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        write_random(tmp, "mamba2", mamba2_layout(MID), lambda w: add_mamba2_kv(w, MID),
                     n_vocab=MID.n_vocab, seed=3, dtype="q8_0", name="mid-mamba2")
        tmp.replace(path)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--n-gen", type=int, default=256)
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = specdec.Model(mid_mamba2())
    prompt = list(range(100, 164))
    plain = Decoder(model, n_ctx=2048, n_threads=a.threads)
    for adaptive, requests in ((True, a.requests), (False, 2)):
        dec = Decoder(model, drafter=NeverRight(MID.n_vocab), n_max=a.n_max, adaptive=adaptive,
                      n_ctx=2048, n_threads=a.threads)
        r = interleave(dec, plain, prompt, a.n_gen, requests)
        per = r.per_request()
        how = "adaptive" if adaptive else f"fixed n_max={a.n_max}"
        print(f"never-right drafter, {how}: {r.tok_s:.1f} tok/s, plain {r.ref_tok_s:.1f} tok/s, "
              f"ratio {r.tok_s / r.ref_tok_s:.3f} (per request {min(per):.3f}-{max(per):.3f}), "
              f"drafted {r.drafted}, accepted {r.accepted}, same output: {r.same_tokens}")


if __name__ == "__main__":
    main()
