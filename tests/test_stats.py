"""Stats that add up, and why a generation stopped."""
import time

import pytest

import specdec
from specdec import Decoder

PROMPT = "a, b, c, d, e, f, g, h, a, b, c, d, e, f, g, h, a, b, c,"
PARTS = ("t_target_s", "t_lm_head_s", "t_draft_s", "t_verify_s", "t_controller_s")


@pytest.mark.parametrize("lazy", [True, False])
def test_time_parts_add_up_to_generation_time(gemma, lazy):
    dec = Decoder(gemma, drafter="ngram", n_max=4, n_ctx=512, lazy_logits=lazy)
    dec.generate(PROMPT, max_tokens=8)                       # warm up
    t0 = time.perf_counter()
    r = dec.generate(PROMPT, max_tokens=64)
    wall = time.perf_counter() - t0
    st = r.stats
    parts = {p: getattr(st, p) for p in PARTS}
    assert abs(sum(parts.values()) - st.t_generate_s) <= 0.02 * st.t_generate_s, parts
    # nothing the request spent is missing: prompt + rounds is the call's wall time, less
    # what happens before the prompt pass and after the last round (tokenizing, results)
    assert st.t_prompt_s + st.t_generate_s <= wall
    assert st.t_prompt_s + st.t_generate_s >= 0.9 * wall - 0.005
    assert st.drafted > 0 and parts["t_draft_s"] > 0 and parts["t_verify_s"] > 0
    assert parts["t_target_s"] > 0.3 * st.t_generate_s
    # the controller's own work is small: the LM head is no longer counted as its time
    assert parts["t_controller_s"] < 0.1 * st.t_generate_s, parts
    if lazy:   # the head (262k-token vocabulary) outweighs the bookkeeping around it
        assert parts["t_lm_head_s"] > parts["t_verify_s"] + parts["t_controller_s"], parts
    else:   # llama.cpp computes the head inside its decode
        assert parts["t_lm_head_s"] < 0.01 * st.t_generate_s, parts


def test_stream_does_not_count_the_callers_time(gemma):
    dec = Decoder(gemma, n_ctx=512)
    st = dec.stream(PROMPT, max_tokens=12)
    t0 = time.perf_counter()
    n = 0
    for _ in st:
        time.sleep(0.05)
        n += 1
    wall = time.perf_counter() - t0
    s = st.result.stats
    assert n >= 10 and s.t_generate_s < wall - 0.9 * 0.05 * n
    assert abs(sum(getattr(s, p) for p in PARTS) - s.t_generate_s) <= 0.02 * s.t_generate_s


def test_finish_reason_length(tiny_dense_path):
    r = specdec.generate(tiny_dense_path, [1, 2, 3], max_tokens=5)
    assert r.finish_reason == "length" and len(r.tokens) == 5


def test_finish_reason_eos(bigram_eos_path):
    from specdec.testing import bigram_successor
    succ = bigram_successor(bigram_eos_path)
    pred = {int(b): a for a, b in enumerate(succ)}
    start = 7
    for _ in range(5):
        start = pred[start]
    r = specdec.generate(bigram_eos_path, [start], max_tokens=100)
    assert r.finish_reason == "eos" and len(r.tokens) == 4 and 7 not in r.tokens


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_finish_reason_context(tiny_dense_path, drafter):
    dec = Decoder(tiny_dense_path, drafter=drafter, n_max=4, n_ctx=256)
    n = dec.ctx.n_ctx_seq
    prompt = [1, 2, 3, 4] * ((n - 10) // 4)
    r = dec.generate(prompt, max_tokens=1000)
    assert r.finish_reason == "context"
    assert len(prompt) + len(r.tokens) == n + 1      # the last token needs no slot
    r = dec.generate(prompt, max_tokens=3)           # room left: the limit is max_tokens
    assert r.finish_reason == "length"


@pytest.mark.parametrize("stop", [" 7", "7, 8", ",", " 1", "6, 7, 8, 9, 1"])
@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_tokens_and_text_agree_after_a_stop_string(gemma, stop, drafter):
    """``text`` ends right before the stop string; ``tokens`` ends with the token in which
    it begins: their text is ``text`` plus at most the stop string's head."""
    dec = Decoder(gemma, drafter=drafter, n_max=4, n_ctx=512)
    r = dec.generate("Count: 1, 2, 3, 4, 5,", max_tokens=40, stop=stop)
    assert r.finish_reason == "stop"
    full = gemma.detokenize(r.tokens)
    assert full.startswith(r.text)
    tail = full[len(r.text):]
    assert stop.startswith(tail)                          # no token wholly inside the stop
    if r.tokens:                                          # the last one starts before the stop
        assert len(gemma.detokenize(r.tokens[:-1])) < len(r.text)
    else:
        assert r.text == ""
    assert stop not in r.text
    assert r.stats.n_generated == len(r.tokens)
