"""The suffix decoding drafter: its tree against brute force, its drafts, the global
corpus, bounded memory, and lossless greedy output."""
import random

import pytest

from specdec import Decoder, Sampling
from specdec.drafters import available, create
from specdec.drafters._run import (run_accept, run_begin, run_observe, run_propose,
                                  run_propose_batch)
from specdec.drafters.suffix import SuffixDrafter
from specdec.drafters._test_hooks import check_suffix_tree, suffix_count


def occurrences(seqs, s):
    n = len(s)
    return sum(1 for q in seqs for i in range(len(q) - n + 1) if q[i:i + n] == s)


def request(d, prompt, generated=(), seq=0):
    """Drive a drafter as the controller does: begin, the prompt, then accepted runs."""
    run_begin(d, seq, prompt)
    run_observe(d, seq, prompt)
    if generated:
        run_observe(d, seq, list(generated))


def test_registered():
    assert "suffix" in available()
    d = create("suffix:32")
    assert isinstance(d, SuffixDrafter) and d.max_depth == 32 and d.name == "suffix"
    with pytest.raises(ValueError):
        SuffixDrafter(0)
    with pytest.raises(ValueError):
        SuffixDrafter(min_prob=1.5)


@pytest.mark.parametrize("depth,vocab", [(1, 2), (3, 3), (8, 2), (64, 5)])
def test_tree_counts_match_brute_force(depth, vocab):
    """Counts of every probed string equal its occurrences, through incremental growth
    (local tree) and FIFO eviction (corpus), and every invariant holds after each step."""
    rng = random.Random(depth * 100 + vocab)
    d = SuffixDrafter(depth, max_corpus_tokens=120)
    run_begin(d, 0, [])
    local, docs = [], []
    for _ in range(30):
        chunk = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
        run_observe(d, 0, chunk)
        local += chunk
        check_suffix_tree(d, 0)
        doc = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        d.add_corpus([doc])
        if len(doc) >= 2:
            docs.append(doc)
            while sum(map(len, docs)) > 120:
                docs.pop(0)
        check_suffix_tree(d, -1)
        assert d.corpus_tokens == sum(map(len, docs))
        for _ in range(10):
            s = [rng.randrange(vocab) for _ in range(rng.randint(1, depth + 1))]
            assert suffix_count(d, s, 0) == occurrences([local], s)
            assert suffix_count(d, s, -1) == occurrences(docs, s)


def test_follows_the_longest_match_and_cycles():
    d = SuffixDrafter(spec_factor=4.0, max_corpus_tokens=0)
    request(d, [1, 2, 3, 4, 5, 6, 2, 3])
    # "2 3 4" was followed by 5 6 2 3, then the history ends: back off to "2 3" -> 4 5 6 ...
    assert run_propose(d, 0, 4, 10) == [5, 6, 2, 3, 4, 5, 6, 2, 3, 4]
    assert run_propose(d, 0, 4, 3) == [5, 6, 2]
    assert run_propose(d, 0, 9, 4) == []             # never seen
    run_accept(d, 0, 0)


def test_most_frequent_continuation_wins():
    d = SuffixDrafter(spec_factor=8.0, max_corpus_tokens=0)
    # after "7 8": 1 three times, 2 once (the latest)
    request(d, [7, 8, 1, 0, 7, 8, 1, 0, 7, 8, 2, 0, 7, 8, 1, 0, 5])
    assert run_propose(d, 0, 7, 1) == [8]
    assert run_propose(d, 0, 8, 1) == [1]
    # equal counts: the most recent continuation, as prompt lookup does
    d2 = SuffixDrafter(max_corpus_tokens=0)
    request(d2, [7, 8, 1, 7, 8, 2, 7])
    assert run_propose(d2, 0, 8, 1) == [2]


def test_draft_length_follows_confidence():
    """Same n_max: a repetitive context drafts all of it, an ambiguous one stops where the
    estimated probability of the draft falls below min_prob, and a higher min_prob stops sooner."""
    periodic = [9, 1, 2, 3] * 6
    # after "7 9" came 2, 3, 4 and 5: each continuation has probability 1/4
    ambiguous = [9, 1, 7, 9, 2, 7, 9, 3, 7, 9, 4, 7, 9, 5, 7]

    def draft(hist, last, min_prob):
        d = SuffixDrafter(min_prob=min_prob, spec_factor=16.0, max_corpus_tokens=0)
        request(d, hist)
        return run_propose(d, 0, last, 16)

    assert len(draft(periodic, 9, 0.1)) == 16
    # 5 (p = 1/4), 7 (1/4: "7 9 5" went on with 7 once), 9 (1/4), then another 1/4 branch
    assert draft(ambiguous, 9, 0.2) == [5, 7, 9]
    assert draft(ambiguous, 9, 0.3) == []
    assert len(draft(ambiguous, 9, 0.05)) > 3


def test_a_rounds_confidence_floor_stops_the_draft_when_higher():
    """A round's confidence floor (the adaptive policy's ``p_stop``; in a batch, what a verify
    row must be kept with to pay) stops the draft as a higher ``min_prob`` does; below
    ``min_prob`` it changes nothing, and a call outside a round keeps none of it."""
    ambiguous = [9, 1, 7, 9, 2, 7, 9, 3, 7, 9, 4, 7, 9, 5, 7]
    d = SuffixDrafter(min_prob=0.05, spec_factor=16.0, max_corpus_tokens=0)
    request(d, ambiguous)
    assert len(run_propose_batch(d, [0], [9], [16], [0.0])[0]) > 3
    # as min_prob 0.2 and 0.3 (test_draft_length_follows_confidence)
    assert run_propose_batch(d, [0], [9], [16], [0.2]) == [[5, 7, 9]]
    assert run_propose_batch(d, [0], [9], [16], [0.3]) == [[]]
    assert len(d.propose(0, 9, 16)) > 3
    d2 = SuffixDrafter(min_prob=0.2, spec_factor=16.0, max_corpus_tokens=0)
    request(d2, ambiguous)
    assert run_propose_batch(d2, [0], [9], [16], [0.1]) == [[5, 7, 9]]


def test_spec_factor_caps_short_matches():
    d = SuffixDrafter(max_corpus_tokens=0)                 # spec_factor 1.0
    request(d, [5, 1, 2, 3, 4, 6, 7, 8])
    assert run_propose(d, 0, 1, 8) == [2]                  # a 1-token match drafts 1 token
    run_observe(d, 0, [1, 2])
    assert run_propose(d, 0, 3, 8) == [4, 6, 7]            # "1 2 3" matched: 3 tokens


def test_corpus_persists_across_requests():
    d = SuffixDrafter()
    answer = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    request(d, [1, 2, 3], answer)
    assert d.corpus_tokens == 0                            # still the active request
    # the next request commits the previous generation (not its prompt) to the corpus
    request(d, [4, 5, 6], [40, 41])
    assert d.corpus_tokens == len(answer) and d.corpus_sequences == 1
    assert suffix_count(d, [40, 41, 42], -1) == 1 and suffix_count(d, [1, 2], -1) == 0
    # the local tree has never seen 42: the draft comes from the corpus
    assert run_propose(d, 0, 42, 4) == [43, 44, 45]
    # user documents, and an explicit commit
    d.add_corpus([[70, 71, 72, 73, 74, 75]])
    request(d, [8, 9], [70, 71, 72])
    assert run_propose(d, 0, 73, 4) == [74, 75]
    assert d.corpus_sequences == 3 and d.corpus_tokens == len(answer) + 6 + 2
    d.finish(0)                                            # [70, 71, 72] now, not at the next begin
    assert d.corpus_sequences == 4 and d.corpus_tokens == len(answer) + 6 + 2 + 3
    d.finish(0)                                            # nothing new since
    assert d.corpus_sequences == 4
    d.forget_text()
    assert d.corpus_tokens == 0 and d.tree_nodes() == 1


def test_corpus_is_bounded_and_evicts_oldest():
    d = SuffixDrafter(16, max_corpus_tokens=500)
    rng = random.Random(3)
    first = [1000 + i for i in range(50)]
    d.add_corpus([first])
    assert run_propose(d, 0, 1000, 4) == [1001]          # match of 1: spec_factor caps at 1
    for _ in range(200):
        d.add_corpus([[rng.randrange(300) for _ in range(rng.randint(2, 60))]])
        assert d.corpus_tokens <= 500
        assert d.tree_nodes() <= 2 * d.corpus_tokens + 1
    check_suffix_tree(d, -1)
    assert suffix_count(d, [1000, 1001], -1) == 0                 # the oldest document is gone
    assert run_propose(d, 0, 1000, 4) == []
    d.add_corpus([list(range(2000, 3000))])                # longer than the cap: its tail
    assert d.corpus_tokens == 500 and d.corpus_sequences == 1
    assert suffix_count(d, [2499, 2500], -1) == 0 and suffix_count(d, [2500, 2501], -1) == 1
    check_suffix_tree(d, -1)
    off = SuffixDrafter(max_corpus_tokens=0)
    off.add_corpus([[1, 2, 3]])
    assert off.corpus_tokens == 0


def test_corpus_token_ids_are_checked(tiny_dense):
    from specdec import Context
    d = SuffixDrafter()
    d.add_corpus([[1, 2, 3, 1000]])
    with pytest.raises(ValueError, match="vocabulary"):
        d.bind(Context(tiny_dense, n_ctx=64), 1)           # tiny_dense has 256 tokens
    d.forget_text()
    d.bind(Context(tiny_dense, n_ctx=64), 1)
    with pytest.raises(ValueError):
        d.add_corpus([[1, 2, 256]])
    with pytest.raises(ValueError):
        d.add_corpus([[1, -2, 3]])


PROMPTS = [
    list(range(3, 40)) * 3,
    [5, 6, 7, 8] * 20,
    [1, 2, 3, 1, 2, 4] * 8 + list(range(100, 120)),
]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["ramp", "period4", "mixed"])
def test_greedy_equal_to_plain_synthetic(tiny_dense, prompt):
    plain = Decoder(tiny_dense, n_ctx=512).generate(prompt, max_tokens=96)
    dec = Decoder(tiny_dense, drafter="suffix", n_max=8, n_ctx=512, check=True)
    first = dec.generate(prompt, max_tokens=96)
    assert first.tokens == plain.tokens
    assert first.stats.accepted > 0
    # the second request finds the first generation in the corpus
    again = dec.generate(prompt, max_tokens=96)
    assert again.tokens == plain.tokens
    assert dec.drafters[0].corpus_tokens > 0
    assert again.stats.rounds <= first.stats.rounds


def test_sampled_decoding_runs(tiny_dense):
    dec = Decoder(tiny_dense, drafter="suffix", n_max=8, n_ctx=512)
    r = dec.generate(PROMPTS[1], max_tokens=48, sampling=Sampling(temperature=0.7, seed=1))
    assert 0 < len(r.tokens) <= 48 and all(0 <= t < 256 for t in r.tokens)


PASSAGE = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in long "
           "strips. Every night for ninety years its lamp had turned, sweeping the dark water for "
           "ships that no longer came. The keeper, a quiet man named Elias, still climbed the "
           "spiral stairs each evening to polish the glass and wind the clockwork.")
REPEAT = (f"<start_of_turn>user\nRepeat this passage exactly:\n\n{PASSAGE}<end_of_turn>\n"
          "<start_of_turn>model\n")


def test_suffix_accepts_a_repeated_passage(gemma):
    plain = Decoder(gemma, n_ctx=1024).generate(REPEAT, max_tokens=60)
    spec = Decoder(gemma, drafter="suffix", n_max=16, n_ctx=1024, check=True).generate(
        REPEAT, max_tokens=60)
    s = spec.stats
    assert s.acceptance_rate > 0.8 and s.accepted > 40
    assert s.rounds < 20
    # batched verification may flip near-ties on quantized weights: compare a prefix
    assert spec.tokens[:20] == plain.tokens[:20]


def test_batch_sequences_have_their_own_trees(tiny_dense):
    plain = [Decoder(tiny_dense, n_ctx=512).generate(p, max_tokens=64).tokens for p in PROMPTS[:2]]
    dec = Decoder(tiny_dense, drafter="suffix", n_max=8, n_ctx=1024, n_seq_max=2, check=True)
    res = dec.generate_batch(PROMPTS[:2], max_tokens=64)
    assert [r.tokens for r in res] == plain
    assert res[0].stats.accepted > 0


def test_decoder_p_min_sets_min_prob(tiny_dense):
    assert Decoder(tiny_dense, drafter="suffix", n_ctx=64).drafters[0].min_prob == pytest.approx(0.1)
    assert Decoder(tiny_dense, drafter="suffix", p_min=0.5, n_ctx=64).drafters[0].min_prob == 0.5
