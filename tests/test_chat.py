"""Chat: real templates of three families in synthetic GGUFs, llama.cpp's built-ins, errors."""
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import specdec
from specdec._core import chat_apply_template
from specdec.chat import ChatTemplate, ChatTemplateError, chat_prompt, normalize_messages
from specdec.testing.chat import write_tiny_chat

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
# family -> (template file from llama.cpp's models/templates, its end-of-turn token)
FAMILIES = {
    "gemma": ("google-gemma-2-2b-it.jinja", "<end_of_turn>"),
    "llama3": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|eot_id|>"),
    "chatml": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>"),
}
# Meta-Llama-3-8B-Instruct's tokenizer.chat_template (as in llama.cpp's test-chat-template.cpp);
# 3.2's adds a dated system turn that the built-in llama3 template does not write
LLAMA3_8B = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
             "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
             "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
             "%}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>"
             "\n\n' }}")
TALK = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you?"}]


def template_text(family):
    return (TEMPLATES / FAMILIES[family][0]).read_text()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> a tiny model with the family's real template, replying "Hi!" then its end of turn"""
    out = {}
    for fam, (_, eot) in FAMILIES.items():
        path = write_tiny_chat(tmp_path_factory.mktemp("chat") / f"{fam}.gguf", fam,
                               chat_template=template_text(fam), reply="Hi!", end_token=eot)
        out[fam] = specdec.Model(str(path))
    return out


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request, models):
    return request.param, models[request.param]


@pytest.fixture(scope="module")
def no_template_model(tmp_path_factory):
    path = write_tiny_chat(tmp_path_factory.mktemp("chat") / "none.gguf", "gemma",
                           chat_template=None, reply="ok", end_token="<end_of_turn>")
    return specdec.Model(str(path))


def test_template_markers_are_single_special_tokens(family_model):
    fam, model = family_model
    p = chat_prompt(model, TALK)
    eot = FAMILIES[fam][1]
    eot_id = model.tokenize(eot, add_special=False, parse_special=True)
    assert len(eot_id) == 1 and eot_id[0] in p.tokens and model.is_eog(eot_id[0])
    assert p.text.count(eot) == 3 + (fam != "gemma")    # llama3 / Qwen add a system turn
    if model.add_bos:    # the template writes BOS; it is not added a second time
        assert p.tokens[0] == model.bos and p.tokens[1] != model.bos
    else:
        assert model.bos not in p.tokens
    assert p.stop == []   # the turn ends with an end-of-generation token


def test_reply_stops_at_end_of_turn(family_model):
    fam, model = family_model
    with specdec.Decoder(model) as dec:
        res = dec.chat(TALK, max_tokens=32)
        assert (res.text, res.finish_reason, len(res.tokens)) == ("Hi!", "eos", 3)
        st = dec.stream_chat(TALK, max_tokens=32)
        assert "".join(st) == "Hi!" and st.result.finish_reason == "eos"


def test_rendering_matches_llama_cpp_builtin():
    """Jinja renders of real templates equal llama.cpp's C++ built-ins (which write no BOS)."""
    msgs = [(m["role"], m["content"]) for m in TALK]
    with_system = [("system", "You are terse.")] + msgs
    cases = [("gemma", template_text("gemma"), "<bos>", msgs),
             ("llama3", LLAMA3_8B, "<|begin_of_text|>", with_system),
             ("chatml", template_text("chatml"), "", with_system)]
    for name, source, bos, conv in cases:
        t = ChatTemplate(source, bos_token=bos, eos_token="</s>")
        jinja = t.render([{"role": r, "content": c} for r, c in conv])
        assert jinja.startswith(bos)
        assert jinja[len(bos):] == chat_apply_template(name, conv), name
        assert jinja[len(bos):] == chat_apply_template(source, conv), name   # detected by markers
        builtin = ChatTemplate(name).render([{"role": r, "content": c} for r, c in conv])
        assert builtin == jinja[len(bos):]


def test_builtin_name_as_override(no_template_model):
    with specdec.Decoder(no_template_model) as dec:
        res = dec.chat([{"role": "user", "content": "hey"}], chat_template="gemma", max_tokens=8)
        assert (res.text, res.finish_reason) == ("ok", "eos")
    p = chat_prompt(no_template_model, [{"role": "user", "content": "hey"}], chat_template="gemma")
    assert p.text == "<start_of_turn>user\nhey<end_of_turn>\n<start_of_turn>model\n"
    assert p.tokens[0] == no_template_model.bos    # built-ins write no BOS: the tokenizer adds it


def test_model_without_template_is_a_clear_error(no_template_model):
    assert no_template_model.chat_template is None
    with specdec.Decoder(no_template_model) as dec:
        with pytest.raises(ChatTemplateError, match="no chat template.*chat_template="):
            dec.chat([{"role": "user", "content": "hey"}])
        with pytest.raises(ChatTemplateError, match="no chat template"):
            dec.stream_chat([{"role": "user", "content": "hey"}])
        assert dec.generate("abc", max_tokens=2).tokens   # still usable


def test_text_end_of_turn_becomes_a_stop_string(no_template_model, tmp_path):
    """A turn that ends in plain text (not a special token) stops there as a stop string."""
    tmpl = ("{% for m in messages %}{{ m.role }}: {{ m.content }}<END>\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
    path = write_tiny_chat(tmp_path / "m.gguf", "gemma", chat_template=tmpl, reply="AB<END>",
                           end_token="<eos>")
    model = specdec.Model(str(path))
    p = chat_prompt(model, [{"role": "user", "content": "x"}])
    assert p.stop == ["<END>"]
    with specdec.Decoder(model) as dec:
        res = dec.chat([{"role": "user", "content": "x"}], max_tokens=20)
        assert (res.text, res.finish_reason) == ("AB", "stop")
        assert "".join(dec.stream_chat([{"role": "user", "content": "x"}])) == "AB"


def test_turn_end_that_opens_with_an_eog_token_needs_no_stop_string(models):
    """Command-R's template writes more after the assistant's end-of-turn token, on the same
    line; generation ends at that token, so nothing of the line becomes a stop string."""
    tmpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
            "{% if m.role == 'assistant' %}<|im_start|>system\nThen act.{% endif %}\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert ChatTemplate(tmpl).end_of_turn == "<|im_end|><|im_start|>system"
    assert chat_prompt(models["chatml"], TALK, chat_template=tmpl).stop == []


TURNMARK = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end_turn|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_control_token_turn_end_becomes_a_stop_token(tmp_path):
    """A turn closed by a control token that is not end-of-generation (its text is empty, so
    no stop string can see it) ends the reply as a stop token."""
    path = write_tiny_chat(tmp_path / "m.gguf", "turnmark", chat_template=TURNMARK,
                           reply="Hi!", end_token="<|end_turn|>")
    model = specdec.Model(str(path))
    p = chat_prompt(model, TALK)
    end = model.tokenize("<|end_turn|>", add_special=False, parse_special=True)
    assert p.stop == [] and p.stop_token_ids == end and not model.is_eog(end[0])
    with specdec.Decoder(model, drafter="ngram") as dec:
        res = dec.chat(TALK, max_tokens=40)
        assert (res.text, res.finish_reason) == ("Hi!", "stop")
        assert "".join(dec.stream_chat(TALK, max_tokens=40)) == "Hi!"
        # the same model, prompted without the chat: it goes on past the turn end
        assert dec.generate(p.tokens, max_tokens=12).text.startswith("Hi!Hi!")
        res = dec.generate(p.tokens, max_tokens=12, stop_token_ids=end)
        assert (res.text, res.finish_reason) == ("Hi!", "stop")
        with pytest.raises(ValueError, match="out of range"):
            dec.generate(p.tokens, stop_token_ids=[model.n_vocab])
        assert dec.chat(TALK, max_tokens=40).text == "Hi!"


def test_template_globals_and_variables(models):
    """The Llama 3.2 template dates its system turn with strftime_now unless given date_string."""
    import datetime
    model = models["llama3"]
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}" in chat_prompt(model, TALK).text
    assert "Today Date: 01 Jan 2000" in chat_prompt(model, TALK, date_string="01 Jan 2000").text


def test_raise_exception_and_decoder_stays_usable(models):
    with specdec.Decoder(models["gemma"]) as dec:
        with pytest.raises(ChatTemplateError, match="System role not supported"):
            dec.chat([{"role": "system", "content": "s"}] + TALK)
        with pytest.raises(ChatTemplateError, match="alternate"):
            dec.chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        assert dec.chat(TALK).text == "Hi!"


@pytest.mark.parametrize("source, match", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe|not safely|access"),
    ("{% for m in messages %}{{ m.content", "chat template"),
    ("{{ messages.append(1) }}", "unsafe|not safely|immutable|access"),
    ("not-a-builtin", "neither Jinja nor"),
    ("", "non-empty"),
    ("{{ messages[5].content }}", "failed"),
])
def test_bad_templates(source, match):
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source).render(TALK)


#: every template llama.cpp's pinned tree collects from real models (built with it; absent in
#: an installed-package test run)
LLAMA_TEMPLATES = (Path(__file__).parent.parent / "subprojects" / "llama.cpp" / "models"
                   / "templates")
#: those that refuse a plain chat by design: they need the caller's ``functions``
NEEDS_VARIABLES = {"fireworks-ai-llama-3-firefunction-v2.jinja"}


@pytest.mark.skipif(not LLAMA_TEMPLATES.is_dir(), reason="no llama.cpp source tree here")
def test_every_llama_cpp_template_renders_a_chat():
    """The real templates of llama.cpp's collection render a 3-turn chat in order, with and
    without the generation prompt; ``{% generation %}`` blocks (LFM2.5, Laguna) render as is."""
    files = sorted(LLAMA_TEMPLATES.glob("*.jinja"))
    assert len(files) > 40
    failed = []
    for f in files:
        t = ChatTemplate(f.read_text(), bos_token="<s>", eos_token="</s>")
        try:
            out = t.render(TALK)
            closed = t.render(TALK, add_generation_prompt=False)
        except ChatTemplateError as e:
            if f.name not in NEEDS_VARIABLES:
                failed.append(f"{f.name}: {e}")
            continue
        at = [out.find(m["content"]) for m in TALK]
        if not (0 <= at[0] < at[1] < at[2]) or len(closed) > len(out):
            failed.append(f"{f.name}: turns out of order or generation prompt missing")
    assert not failed, failed


def test_generation_blocks_render_their_body():
    src = ("{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%}"
           "[{{ m.content }}]{%- endgeneration -%}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert ChatTemplate(src).render(TALK) == "Hello[Hi there]Who are you?"


@pytest.mark.parametrize("messages, match", [
    ("hello", "list"),
    ([], "empty"),
    ([{"content": "x"}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": 5}], "string or a list"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text parts"),
    (["user: hi"], "object"),
])
def test_bad_messages(messages, match):
    with pytest.raises(ValueError, match=match):
        normalize_messages(messages)


def test_text_parts_are_joined():
    msgs = normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"


def test_gemma_model_chats_with_builtin_template(gemma):
    """The real Gemma vocab: its turn markers are special tokens and <end_of_turn> ends a reply."""
    p = chat_prompt(gemma, [{"role": "user", "content": "Say hi."}], chat_template=template_text("gemma"))
    eot = gemma.tokenize("<end_of_turn>", add_special=False, parse_special=True)
    assert len(eot) == 1 and gemma.is_eog(eot[0]) and p.tokens.count(eot[0]) == 1
    assert p.tokens[0] == gemma.bos and p.tokens[1] != gemma.bos
    builtin = chat_prompt(gemma, [{"role": "user", "content": "Say hi."}], chat_template="gemma")
    assert builtin.tokens == p.tokens
    with specdec.Decoder(gemma, drafter="ngram") as dec:
        res = dec.chat([{"role": "user", "content": "Say hi."}], chat_template="gemma",
                       max_tokens=16)
        assert res.finish_reason in ("eos", "length") and res.stats.n_prompt == len(p.tokens)


def test_import_stays_light():
    code = "import sys, specdec; print('jinja2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_chat_cli(models):
    model = models["chatml"]
    p = subprocess.run([sys.executable, "-m", "specdec", "chat", "-m", model.path,
                        "--system", "Be brief.", "-n", "16"],
                       input="Hello\n/help\n/reset\n/nope\nAgain\n", capture_output=True,
                       text=True, cwd=tempfile.gettempdir(), timeout=300)
    assert p.returncode == 0, p.stderr
    # the commands never reach the model: two replies, to Hello and Again
    assert p.stdout.splitlines() == ["Hi!", "Hi!"]
    assert p.stderr.count("[3 tokens,") == 2 and "finish=eos" in p.stderr
    assert "/reset" in p.stderr and "/exit" in p.stderr                  # /help lists them
    assert "[conversation reset: the system message is kept]" in p.stderr
    assert "[unknown command /nope: /help lists them]" in p.stderr


def test_chat_cli_without_template(no_template_model):
    p = subprocess.run([sys.executable, "-m", "specdec", "chat", "-m", no_template_model.path],
                       input="", capture_output=True, text=True, cwd=tempfile.gettempdir(),
                       timeout=300)
    assert p.returncode == 1 and "no chat template" in p.stderr
    # the flag to type, not the Python keyword
    assert "--chat-template" in p.stderr and "chat_template=" not in p.stderr, p.stderr
