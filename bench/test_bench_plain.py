"""Plain greedy decoding: specdec against ``llama-bench -p 0 -n 128``, in one run.

llama-bench decodes one token per call from an empty context and samples
nothing; specdec's number includes picking the argmax over the 262k-token
vocabulary and the controller, i.e. real generation. Runs alternate between the
two so that drift hits both alike; the ratio of medians is the result.
"""
import statistics

import pytest

import specdec

from specdec.benchmark.llama_tools import ensure_tools, run_bench

N_GEN = 128
ROUNDS = 3


def _specdec_tok_s(dec, bos):
    r = dec.generate([bos], max_tokens=N_GEN + 1)   # the first token comes from the prompt pass
    assert r.stats.n_generated == N_GEN + 1
    return r.stats.tokens_per_s


@pytest.mark.peer
def test_plain_vs_llama_bench(benchmark, gemma_path):
    ensure_tools(("llama-bench",))
    model = specdec.Model(gemma_path)
    dec = specdec.Decoder(model, n_ctx=512, n_threads=2)
    _specdec_tok_s(dec, model.bos)  # warm-up, as llama-bench does
    ours, theirs = [], []
    for _ in range(ROUNDS):
        theirs.append(run_bench(gemma_path, n_gen=N_GEN, threads=2, reps=2)["tok_s_mean"])
        ours.append(statistics.mean(_specdec_tok_s(dec, model.bos) for _ in range(2)))
    ratio = statistics.median(ours) / statistics.median(theirs)
    benchmark.extra_info.update({"specdec_tok_s": ours, "llama_bench_tok_s": theirs, "ratio": ratio})
    print(f"\nplain greedy, gemma3-270m Q4_K_M, 2 threads, {N_GEN} tokens: specdec "
          f"{statistics.median(ours):.1f} tok/s, llama-bench {statistics.median(theirs):.1f} tok/s, "
          f"ratio {ratio:.3f}")
    benchmark.pedantic(_specdec_tok_s, args=(dec, model.bos), rounds=1, iterations=1)
    assert ratio >= 0.97
