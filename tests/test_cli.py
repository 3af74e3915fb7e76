"""The command line, as a user runs it."""
import json
import subprocess
import tempfile
import sys

import pytest


def _run(*args, check=True):
    # run outside the repo: `python -m` puts the cwd first on sys.path, where the uncompiled
    # source folder would shadow the installed package
    p = subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                       timeout=300, cwd=tempfile.gettempdir())
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_generate_json_default_model(gemma_path):
    p = _run("generate", "--prompt", "The capital of France is", "--max-tokens", "12", "--json")
    out = json.loads(p.stdout)
    assert set(out) >= {"text", "tokens", "finish_reason", "stats"}
    assert len(out["tokens"]) == 12 and out["finish_reason"] == "length"
    assert {"n_prompt", "n_generated", "tokens_per_s"} <= set(out["stats"])
    assert out["stats"]["n_generated"] == 12


def test_generate_text_with_model(tiny_dense_path):
    p = _run("generate", "-m", tiny_dense_path, "-p", "tok_5", "-n", "4")
    assert "4 tokens" in p.stderr


def test_drafters_lists_builtins():
    from specdec.drafters import BUILTINS
    p = _run("drafters")
    # one line per drafter, starting with its usage: "ngram[:N]" is not "ngram-map[:N]"
    usages = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    for b in BUILTINS.values():
        assert usages.count(b.usage) == 1, (b.usage, usages)
    for b in BUILTINS.values():
        assert any(line.startswith(b.usage + " ") and b.summary in line
                   for line in p.stdout.splitlines()), b.usage


def test_bad_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_text("nope")
    p = _run("generate", "-m", str(bad), "-p", "x", check=False)
    assert p.returncode == 1 and "not a GGUF" in p.stderr
    p = _run("generate", "-m", str(tmp_path / "missing.gguf"), "-p", "x", check=False)
    assert p.returncode == 1 and "not found" in p.stderr


def test_errors_name_flags_not_python_keywords(tiny_dense_path):
    import argparse

    from specdec.cli import in_flags

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    g = sub.add_parser("generate")
    g.add_argument("--n-gpu-layers", "-ngl", type=int)
    g.add_argument("--chat-template")
    assert in_flags("use n_gpu_layers=0 for the CPU; pass chat_template= a name, not x=1",
                    parser, "generate") == \
        "use --n-gpu-layers 0 for the CPU; pass --chat-template a name, not x=1"
    assert in_flags("chat_template must be text", parser, "generate") == \
        "--chat-template must be text"
    p = _run("generate", "-m", tiny_dense_path, "-p", "x", "--presence-penalty", "5",
             check=False)
    assert p.returncode == 1 and "--presence-penalty must be in [-2, 2]" in p.stderr, p.stderr
    p = _run("generate", "-m", tiny_dense_path, "-p", "tok_5", "-n", "4", "--json",
             "--repetition-penalty", "1.5", "--presence-penalty", "0.5")
    import specdec
    with specdec.Decoder(tiny_dense_path) as dec:
        want = dec.generate("tok_5", max_tokens=4, repetition_penalty=1.5, presence_penalty=0.5)
    assert json.loads(p.stdout)["tokens"] == want.tokens
    if any(d["type"] in ("gpu", "igpu") for d in specdec.devices()):
        pytest.skip("this build has an accelerator: -ngl 99 works")
    p = _run("generate", "-m", tiny_dense_path, "-p", "x", "-n", "2", "-ngl", "99", check=False)
    assert p.returncode == 1 and "--n-gpu-layers 99 asks for layers on a device" in p.stderr
    assert "n_gpu_layers" not in p.stderr, p.stderr
