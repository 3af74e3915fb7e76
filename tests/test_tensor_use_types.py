"""Tensor types judged by the op each tensor feeds, not by the tensor alone.

An rwkv7 file whose lerp tensors are f16 passed the pre-check (f16 has a matmul kernel) and
then killed the process in ggml's compute threads (binary-ops.cpp: "unsupported types"):
element-wise ops take fewer types than matmuls. A new context's graph is now checked node by
node (``_graph_check.h``) before anything is computed. Every architecture and drafter family
the testing writers make is written in every weight type they offer; each either generates or
is refused with a GGUFError at load, naming the tensor and the op, and never dies: the cases
run in a child process, so a death is a failure here, not a lost pytest.
"""
import subprocess
import sys
import textwrap

import pytest

import specdec
from specdec import Decoder, GGUFError
from specdec.testing import write_tiny_rwkv7

DTYPES = ("f32", "f16", "bf16", "q8_0")

# writer expression (of a path p, a dtype d, and the fixtures' target paths) per family
FAMILIES = {
    "rwkv7": "T.write_tiny_rwkv7(p, dtype=d)",
    "mamba2": "T.write_tiny_mamba2(p, dtype=d)",
    "qwen3next": "T.write_tiny_qwen3next(p, dtype=d)",
    "qwen35": "T.write_tiny_qwen35(p, dtype=d)",
    "dense": "T.write_tiny_dense(p, dtype=d)",
    "gemma3": "T.write_tiny_gemma3(p, dtype=d)",
    "eagle3": "T.write_eagle3_draft(p, BIGRAM, dtype=d)",
    "dflash": "T.write_dflash_draft(p, PERIODIC, dtype=d)",
}
DRAFTERS = {"eagle3": "BIGRAM", "dflash": "PERIODIC"}


def test_rwkv7_f16_lerp_is_refused_at_load(tmp_path):
    p = write_tiny_rwkv7(tmp_path / "rwkv7-f16.gguf", dtype="f16")
    with pytest.raises(GGUFError, match=r"cannot be computed: tensor '.*' \(f16\) feeds node "
                                        r"'.*' \((MUL|ADD|SUB)"):
        Decoder(p).generate("hello world", max_tokens=6)
    # the process and the library stay usable
    r = Decoder(write_tiny_rwkv7(tmp_path / "rwkv7.gguf")).generate("hello world", max_tokens=6)
    assert len(r.tokens) == 6


def test_refusal_frees_the_context_and_keeps_the_model(tmp_path):
    m = specdec.Model(write_tiny_rwkv7(tmp_path / "rwkv7-q8.gguf", dtype="q8_0"))
    for _ in range(3):
        with pytest.raises(GGUFError, match="q8_0"):
            specdec.Context(m, n_ctx=64)
    assert m.tokenize("hello")   # the model itself is fine


_CHILD = textwrap.dedent("""
    import sys, traceback
    import specdec.testing as T
    from specdec import Decoder, GGUFError
    fam, expr, role, workdir = sys.argv[1:5]
    BIGRAM, PERIODIC = sys.argv[5:7]
    for d in sys.argv[7:]:
        p = f"{workdir}/{fam}-{d}.gguf"
        try:
            eval(expr)
        except ValueError as e:          # a writer that does not offer this type
            print(f"SKIP {d} {e}", flush=True)
            continue
        print(f"CASE {d}", flush=True)
        try:
            if role == "target":
                r = Decoder(p, n_ctx=128).generate("hello world", max_tokens=6)
            else:
                tgt = {"BIGRAM": BIGRAM, "PERIODIC": PERIODIC}[role]
                drafter = ("eagle3:" if "BIGRAM" in role else "dflash:") + p
                r = Decoder(tgt, n_ctx=128, drafter=drafter, n_max=3).generate(
                    [1, 2, 3, 1, 2, 3], max_tokens=6)
            print(f"OK {d} {len(r.tokens)}", flush=True)
        except GGUFError as e:
            print(f"REFUSED {d} {e}", flush=True)
        except Exception as e:
            print(f"OTHER {d} {type(e).__name__}: {e}", flush=True)
    print("DONE", flush=True)
""")


@pytest.fixture(scope="module")
def targets(model_file):
    from specdec.testing import write_bigram_mtp_model
    return (model_file("bigram-qwen35-n0.0.gguf", lambda p: write_bigram_mtp_model(p)),
            model_file("bigram-qwen35-period16.gguf",
                       lambda p: write_bigram_mtp_model(p, period=16)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_in_every_type_generates_or_is_refused(family, targets, tmp_path):
    role = DRAFTERS.get(family, "target")
    p = subprocess.run([sys.executable, "-c", _CHILD, family, FAMILIES[family], role,
                        str(tmp_path), *targets, *DTYPES],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines and lines[-1] == "DONE", (
        f"the child died (exit {p.returncode}) after {lines[-1:]}: {p.stderr[-800:]}")
    outcomes = {ln.split()[1]: ln.split()[0] for ln in lines if ln.split()[0] in
                ("OK", "REFUSED", "OTHER")}
    print(f"\n{family}: {outcomes}")
    assert "OTHER" not in outcomes.values(), lines
    assert outcomes.get("f32") == "OK", lines   # the writers' own files always run
    for ln in lines:
        if ln.startswith("REFUSED"):
            assert "feeds node" in ln or "must be f32" in ln or "cannot compute" in ln, ln
