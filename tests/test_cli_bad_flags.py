"""Bad flags and paths on the command line end with ``specdec: error: ...`` and status 1 or 2,
never a Python traceback: a model or prompt path that is a folder, a ``--port`` out of range
(``getaddrinfo`` took 99999 as port 34463 and served there), a ``--host`` that does not
resolve; and an error message keeps the GGUF key it names (``tokenizer.chat_template`` had
become ``tokenizer.--chat-template``)."""
import argparse
import subprocess
import sys
import tempfile

import pytest


def _run(*args):
    p = subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                       timeout=300, cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize("args, message", [
    (["serve", "--port", "99999"], "--port must be in 0..65535"),
    (["serve", "--port", "-1"], "--port must be in 0..65535"),
    (["serve", "--host", "256.0.0.1", "--port", "0"], "--host '256.0.0.1' is not an address"),
])
def test_serve_address_checked_before_the_model_loads(tiny_dense_path, args, message):
    p = _run(*args[:1], "-m", tiny_dense_path, *args[1:])
    assert p.returncode == 1 and message in p.stderr, p.stderr


def test_serve_on_a_taken_port_says_so(tiny_dense_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = _run("serve", "-m", tiny_dense_path, "--port", str(port))
    assert p.returncode == 1, p.stderr
    assert f"specdec: error: cannot listen on 127.0.0.1:{port}" in p.stderr, p.stderr


@pytest.mark.parametrize("args", [["-m", "{dir}", "--prompt", "x"],
                                  ["-m", "{model}", "-f", "{dir}"]], ids=["model", "prompt"])
def test_a_folder_for_a_file_is_a_clear_error(tiny_dense_path, tmp_path, args):
    args = [a.format(dir=tmp_path, model=tiny_dense_path) for a in args]
    p = _run("generate", *args)
    assert p.returncode == 1 and p.stderr.startswith("specdec: error: "), p.stderr
    assert str(tmp_path) in p.stderr, p.stderr


def test_flag_names_leave_dotted_keys_and_paths_alone():
    from specdec.cli import in_flags

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("chat").add_argument("--chat-template")
    assert in_flags("no tokenizer.chat_template in the GGUF: pass chat_template= a name, "
                    "see /x/chat_template/y or chat_template.", parser, "chat") == \
        "no tokenizer.chat_template in the GGUF: pass --chat-template a name, " \
        "see /x/chat_template/y or --chat-template."


def test_chat_without_a_template_names_the_key_and_the_flag(tiny_dense_path):
    p = _run("chat", "-m", tiny_dense_path)
    assert p.returncode == 1, p.stderr
    assert "no tokenizer.chat_template in the GGUF" in p.stderr, p.stderr
    assert "pass --chat-template" in p.stderr, p.stderr


@pytest.mark.parametrize("template, message", [
    ("bogusname", "'bogusname' is neither Jinja nor a llama.cpp built-in template name"),
    ("{% if %}", "Expected an expression"),
    ("@/nonexistent/template.jinja", "No such file or directory"),
])
def test_serve_checks_its_chat_template_before_serving(tiny_dense_path, template, message):
    # it started and answered every chat with a 400 (the bad file alone was refused)
    p = _run("serve", "-m", tiny_dense_path, "--port", "0", "--chat-template", template)
    assert p.returncode == 1 and message in p.stderr, p.stderr
    assert "listening on" not in p.stderr, p.stderr


@pytest.mark.parametrize("key, env", [("", None), ("  ", None), (" k3y", None), (None, "")],
                         ids=["empty", "blank", "spaced", "empty-env"])
def test_serve_refuses_an_api_key_no_header_can_match(key, env, monkeypatch, tiny_dense_path):
    """``--api-key "$KEY"`` with ``KEY`` unset let in every request that sent ``Bearer `` and
    nothing: refused at parse time (status 2), before the model loads."""
    if env is not None:
        monkeypatch.setenv("SPECDEC_API_KEY", env)
    args = ["serve", "-m", tiny_dense_path, "--port", "0"]
    p = _run(*args, *([] if key is None else ["--api-key", key]))
    assert p.returncode == 2 and "--api-key" in p.stderr and "key" in p.stderr, p.stderr


def test_the_app_refuses_an_empty_api_key():
    pytest.importorskip("starlette")
    from specdec.serve import create_app
    with pytest.raises(ValueError, match="api_key"):
        create_app(None, ["m"], api_key="")
