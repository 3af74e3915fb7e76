"""``specdec bench --gpu``: the plumbing, tested on a CPU with a local RPC server standing in for
the device (``--rpc-standin``), and what happens without a GPU.

What a real GPU adds (CUDA kernels, the device's timings) is measured by the lead's GPU run;
here: every layer goes to the "device" on both sides, the peers get the same placement in
their flags, the exact check is marked as not run on a device, the machine class names the
device, and no GPU means exit 2 before anything is measured.
"""
from __future__ import annotations

import pytest

from specdec.benchmark import cli as bench_cli, matrix, report
from specdec.benchmark.runner import INJECT_ENV, Runner, rows_of
from specdec.cli import main


@pytest.fixture
def bench_cache(tmp_path, monkeypatch):
    from specdec.benchmark import llama_tools

    monkeypatch.setenv("SPECDEC_LLAMA_TOOLS_DIR", str(llama_tools.tools_dir()))
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(INJECT_ENV, raising=False)


def test_gpu_without_a_gpu_says_so_and_exits_2(capsys):
    import specdec

    if any(d["type"] in ("gpu", "igpu") for d in specdec.devices()):
        pytest.skip("this machine has a GPU")
    assert main(["bench", "--gpu", "--quick", "--no-plots", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no GPU to measure on" in err and "nothing measured" in err
    assert "Traceback" not in err
    # the Engine step alone too: it must not measure the CPU under a GPU label
    assert main(["bench", "--gpu", "--case", "engine-mtp", "--no-plots", "-q"]) == 2
    assert "no GPU to measure on" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--n-gpu-layers", "8"], ["--rpc-standin"], ["--gpu", "--ci"],
                                  ["--gpu", "--n-gpu-layers", "0"]])
def test_gpu_options_without_gpu_or_with_another_tier_are_usage_errors(argv, capsys):
    assert main(["bench", "--no-plots", "-q", *argv]) == 3
    assert capsys.readouterr().err.startswith("specdec bench: error: ")


def test_gpu_matrices_run_what_the_issue_asks():
    full, quick = matrix.gpu(), matrix.gpu(quick=True)
    sizes = {(c.size, c.accuracy) for c in full.cases}
    assert {("large", 0.9), ("large", 0.7), ("large", 0.5), ("mid", 0.9), ("mid", 0.7)} <= sizes
    # --quick too: MTP at 90/70/50% (the Engine step adds 1/4/8/16 slots: engine_mtp.GPU_SLOTS)
    assert {(c.size, c.accuracy) for c in quick.cases} == {("large", 0.9), ("large", 0.7),
                                                           ("large", 0.5)}
    for m in (full, quick):
        for c in m.cases:
            fixed = {x.n_max for x in c.methods if x.side == "specdec" and x.family == "mtp"
                     and not x.adaptive}
            theirs = {x.n_max for x in c.methods if x.drafter == "draft-mtp"}
            assert fixed == theirs and (c.size != "large" or max(fixed) == 8)
            assert any(x.adaptive for x in c.methods)
            # plain against both of llama.cpp's: llama-bench and a tool that samples
            assert {x.drafter for x in c.methods if x.side == "llama.cpp"
                    and x.family in ("plain", "greedy")} == {"llama-bench", "llama-simple"}
            assert c.model == "bigram"          # synthetic: nothing to download on a GPU box
    from specdec.testing.bigram import bigram_dims

    d = bigram_dims("large")
    assert (d.n_embd, d.n_layer, d.n_head, d.n_head_kv, d.n_ff, d.ssm_groups, d.ssm_v_heads) == \
        (2048, 24, 16, 4, 5632, 16, 16)


def test_serve_commands_put_every_layer_on_the_device():
    from pathlib import Path

    from specdec.benchmark import serve

    ours = serve._specdec_argv("m.gguf", 1, 16, drafter="ngram", threads=2, n_gpu_layers=-1)
    assert ours[ours.index("--n-gpu-layers") + 1] == "-1" and ours[ours.index("--slots") + 1] == "16"
    theirs = serve._llama_argv(Path("llama-server"), "m.gguf", 1, 16, spec_type=None, threads=2,
                               n_gpu_layers=-1)
    assert theirs[theirs.index("-ngl") + 1] == "99" and theirs[theirs.index("-np") + 1] == "16"
    assert "--n-gpu-layers" not in serve._specdec_argv("m.gguf", 1, 1, drafter=None, threads=2)
    assert serve.GPU_CONCURRENCY == (1, 4, 8, 16)


def test_peers_are_built_with_specdecs_backend(monkeypatch):
    """A CUDA build of specdec gets CUDA peers (same architectures), in their own cache dir;
    a CPU build keeps the peers' flags and cache dir as they were."""
    import sys
    import types

    from specdec.benchmark.llama_tools import build as b

    cpu_hash = b._flags_hash()
    record = types.ModuleType("specdec._build_options")
    record.CMAKE_DEFINES = {"GGML_NATIVE": "ON", "GGML_RPC": "ON", "GGML_CUDA": "OFF",
                            "GGML_VULKAN": "OFF"}
    monkeypatch.setitem(sys.modules, "specdec._build_options", record)
    assert b.backend_defines() == {} and b._flags_hash() == cpu_hash
    assert b.cpu_only_flags() == ()
    record.CMAKE_DEFINES = {"GGML_NATIVE": "ON", "GGML_RPC": "ON", "GGML_CUDA": "ON",
                            "GGML_VULKAN": "OFF", "CMAKE_CUDA_ARCHITECTURES": "90",
                            "CUDA_cublas_LIBRARY": "/w/nvidia/cublas/lib/libcublas.so.13",
                            "CMAKE_CUDA_FLAGS": "-I/w/nvidia/cuda_runtime/include"}
    assert b.backend_defines() == {"GGML_CUDA": "ON", "GGML_VULKAN": "OFF",
                                   "CMAKE_CUDA_ARCHITECTURES": "90",
                                   "CUDA_cublas_LIBRARY": "/w/nvidia/cublas/lib/libcublas.so.13",
                                   "CMAKE_CUDA_FLAGS": "-I/w/nvidia/cuda_runtime/include"}
    args = b._configure_args(b.Path("/src"), b.Path("/build"))
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args
    assert b._flags_hash() != cpu_hash                # CUDA peers get a cache dir of their own
    assert b.cpu_only_flags() == ("-ngl", "0")        # and CPU runs keep them off the device


def test_the_build_records_its_backend_options():
    from specdec import _build_options, backends

    rec = _build_options.CMAKE_DEFINES
    assert rec["GGML_RPC"] == ("ON" if "RPC" in backends() else "OFF")
    assert rec["GGML_CUDA"] == ("ON" if "CUDA" in backends() else "OFF")


def _tiny_gpu_matrix(peers: bool) -> matrix.Matrix:
    m = matrix.tiny(n_gen=16, reps=2, peers=peers, interleave=2)
    case = m.cases[0]
    if peers:
        case = matrix.Case(case.name, case.model, case.prompts,
                           case.methods + (matrix.LLAMA_GREEDY,), case.n_gen, case.size,
                           case.accuracy, interleave=case.interleave)
    return matrix.Matrix("gpu-quick", (case,), reps=2, check_tokens=8, bench_reps=1,
                         oracle_check_n_max=())


@pytest.mark.slow
def test_gpu_run_over_the_rpc_standin(bench_cache, tmp_path, monkeypatch, capsys):
    """``specdec bench --gpu --quick --rpc-standin``: every specdec row ran with every layer on
    the stand-in device and decodes what plain decoding there decodes; llama.cpp's tools ran
    over their own server with -ngl 99, llama-simple says why it cannot; the results name the
    device, and a baseline of the CPU's class cannot judge them."""
    from specdec.benchmark import runner as runner_mod

    monkeypatch.setitem(matrix.MATRICES, "gpu-quick", lambda: _tiny_gpu_matrix(peers=True))
    seen_flags = []
    real = runner_mod.llama_tools.run_spec_simple

    def spy(*a, **kw):
        seen_flags.append(tuple(kw.get("extra", ())))
        return real(*a, **kw)

    monkeypatch.setattr(runner_mod.llama_tools, "run_spec_simple", spy)
    out = tmp_path / "run"
    rc = main(["bench", "--gpu", "--quick", "--rpc-standin", "--no-plots", "-q", "--out", str(out),
               "--save-baseline", str(tmp_path / "gpu-base.json")])
    assert rc == 0, capsys.readouterr()
    res = report.load_results(out / "results.json")
    assert res["settings"]["n_gpu_layers"] == -1 and res["settings"]["device_rpc"] is True
    assert res["machine"]["device"] == "rpc-standin"
    assert res["machine"]["class"].endswith("-rpc-standin")
    rows = rows_of(res)
    ours = [r for r in rows if r.side == "specdec" and r.prompt != "(empty context)"]
    assert ours and all(r.status == "ok" and r.tok_s > 0 for r in ours)
    assert all(r.match == 1.0 for r in ours)
    assert {r.check for r in ours if "interleaved" not in r.prompt} == {"n/a (device)"}
    by = {r.method: r for r in rows if r.side == "llama.cpp"}
    assert by["llama.cpp plain"].status == "ok" and by["llama.cpp plain"].tok_s > 0
    assert by["llama.cpp draft-mtp n2"].status == "ok"
    assert by["llama.cpp llama-simple greedy"].status == "unavailable"
    assert "no --rpc" in by["llama.cpp llama-simple greedy"].note
    assert seen_flags and all("--rpc" in f and f[f.index("-ngl") + 1] == "99" for f in seen_flags)
    assert "mtp-tiny-90: specdec plain / llama-bench" in res["ratios"]
    # the CPU's baseline is of another class: the gate cannot judge a device run against it
    cpu_base = report.load_json(tmp_path / "gpu-base.json")
    cpu_base["machine"]["class"] = cpu_base["machine"]["class"].removesuffix("-rpc-standin")
    report.save_json(cpu_base, tmp_path / "cpu-base.json")
    assert main(["bench", "--results", str(out / "results.json"), "--no-plots", "-q",
                 "--compare", str(tmp_path / "cpu-base.json")]) == 2
    assert main(["bench", "--results", str(out / "results.json"), "--no-plots", "-q",
                 "--compare", str(tmp_path / "gpu-base.json")]) == 0


def test_runner_places_every_layer_on_the_standin(bench_cache, monkeypatch):
    """The runner alone (no peers): specdec's model is loaded with every layer on the
    stand-in server and decodes plain decoding's tokens there."""
    from specdec.benchmark import runner as runner_mod

    loaded = []
    real = runner_mod.Model
    monkeypatch.setattr(runner_mod, "Model",
                        lambda path, **kw: (loaded.append(kw), real(path, **kw))[1])
    runner = Runner(_tiny_gpu_matrix(peers=False), peers_enabled=False, log=lambda s: None,
                    device_rpc=True)
    assert runner.n_gpu_layers == -1
    res = report.finalize(runner.run())
    assert loaded and all(kw["n_gpu_layers"] == -1 and kw["rpc_servers"].startswith("127.0.0.1:")
                          for kw in loaded)
    rows = rows_of(res)
    assert rows and all(r.status == "ok" for r in rows if r.side == "specdec")
    assert all(r.match == 1.0 for r in rows if r.side == "specdec")
    assert res["machine"]["class"].endswith("-rpc-standin")


def test_gpu_help_documents_it(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "--gpu" in out and "--rpc-standin" in out and "--gpu --quick" in out
    assert bench_cli.EXIT_CANNOT_JUDGE == 2


@pytest.mark.slow
def test_llama_simple_is_timed_as_specdec_plain_is(bench_cache):
    """The greedy peer of --gpu's plain comparison on a CPU: llama-simple's text is specdec
    plain's greedy text, and its decode rate comes from its own eval timing."""
    import specdec
    from specdec.benchmark import llama_tools
    from specdec.benchmark.synthetic import model_for

    path = str(model_for("tiny", 0.9, log=lambda s: None))
    model = specdec.Model(path)
    prompt = matrix.MTP_PROMPT
    echo = b"".join(model.token_to_piece(t, special=True) for t in model.tokenize(
        prompt, add_special=True, parse_special=True)).decode("utf-8", "replace")
    out = llama_tools.run_simple_timed(path, prompt, 24, threads=2, echo=echo,
                                       extra=llama_tools.cpu_only_flags())
    assert out["tok_s"] > 0 and out["n_eval"] == 23        # the first token is the prompt pass's
    ours = specdec.Decoder(model, n_ctx=512).generate(prompt, max_tokens=24)
    assert out["text"] == ours.text
