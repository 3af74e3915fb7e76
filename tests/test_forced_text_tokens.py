"""The tokens llguidance is given for a grammar's forced text spell that text, whatever the
model's tokenizer does with it (issue 31: forced tokens are drafted for free, so a wrong one
would derail the request). The bigram model's pieces are its ids in hex ("be" is token 190)
while its tokenizer maps bytes to ids ("e" to 101): taken as they were, "beef" | "bead" ended
on the invalid "bbe" (or, once grammar failures were raised, failed after two tokens)."""
import pytest

from specdec import Decoder, Model
from specdec.constraint import _Vocab

pytest.importorskip("llguidance")

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def test_forced_text_is_tokenized_into_pieces_that_spell_it(bigram_eos_path):
    m = Model(bigram_eos_path)
    v = _Vocab(m)
    assert b"".join(v._spelling(t) for t in m.tokenize("beef", add_special=False)) != b"beef"
    for text in ("e", "beef", "cafe0", b"12399"):
        want = text.encode() if isinstance(text, str) else text
        assert b"".join(v.tokens[t] for t in v(text)) == want


@pytest.mark.parametrize("choices", [["beef", "bead", "cafe0"], ["be", "ca"], ["abc", "abd"],
                                     ["12345", "12399"]])
def test_choices_on_a_model_whose_tokenizer_disagrees_with_its_pieces(bigram_eos_path, choices):
    with Decoder(bigram_eos_path, exact=True, n_ctx=256) as dec:
        r = dec.generate(PROMPT, max_tokens=16, choices=choices)
        assert r.text in choices and r.finish_reason == "eos"


def test_a_tokenizer_that_spells_its_text_keeps_its_tokens(model_file):
    from specdec.testing.chat import write_tiny_chat
    path = model_file("tiny-bytes-2-layers.gguf", lambda p: write_tiny_chat(
        p, "chatml", chat_template=None, reply="ab", n_layer=2))
    m = Model(path)
    v = _Vocab(m)
    for text in ("ab", "xyz", "hello world"):
        assert v(text) == m.tokenize(text, add_special=False, parse_special=True)
