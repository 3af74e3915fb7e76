"""The serve benchmark's own logic (``specdec bench --case serve``), with its servers and
load client faked: which rows it measures, how it warms the servers, and its report. The
load client against a real server is in test_serve.py."""


def test_benchmark_client_sends_the_sampled_rows_temperature(monkeypatch):
    """The load client is greedy unless its extra fields set a temperature (the serve bench's
    sampled rows send OpenAI's default, 1.0)."""
    from specdec.benchmark import serve, serve_load

    bodies = []

    def fake(host, port, body):
        bodies.append(body)
        return serve_load.Sample(ttft_s=0.01, gaps_s=[], n_tokens=1, latency_s=0.01)
    monkeypatch.setattr(serve_load, "stream_completion", fake)
    serve_load.run_load("h", 1, ["a"], concurrency=1, n_gen=2, n_requests=1)
    serve_load.run_load("h", 1, ["a"], concurrency=1, n_gen=2, n_requests=1,
                        extra=serve.SAMPLED_BODY)
    assert [b["temperature"] for b in bodies] == [0, 1.0] and bodies[1]["seed"] == 1


def test_benchmark_prompts_and_report():
    """The serve benchmark's prompts are the grounded ones; its report takes any concurrency."""
    from specdec.benchmark import prompts, serve

    texts = serve.grounded_prompts()
    assert texts and all(p.text in texts for p in prompts.all_prompts()
                         if p.category in serve.GROUNDED)
    summary = {"tokens_per_s": 10.0, "ttft_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0},
               "itl_ms": {"p50": 1.0, "p90": 2.0, "p99": None}, "tpot_ms_mean": 5.0,
               "errors": 0}
    rows = {f"specdec {d}": {"4": summary} for d in ("plain",) + serve.SPECDEC_DRAFTERS}
    rows.update({f"llama-server {t}": {"4": summary}
                 for t in ("plain",) + serve.LLAMA_SPEC_TYPES})
    best = serve._best(rows, [f"specdec {d}" for d in serve.SPECDEC_DRAFTERS], [4])
    results = {"model": "m", "threads": 2, "n_gen": 8, "n_max": 8, "rows": rows,
               "ratios": {"4": {"best_spec": 1.0, "best_specdec": best["4"],
                                "best_llama_server": "llama-server ngram-simple", "plain": 1.0}}}
    md = serve.markdown(results)
    assert "| 4 | 1.00x" in md and "Decoder.generate" not in md
    # the sampled rows' ratios (OpenAI's default temperature): a column each, '-' when absent
    results["ratios"]["4"].update(sampled_plain_vs_greedy=0.97, sampled_plain_vs_llama=1.2)
    assert "| 1.00x | 0.97x | 1.20x |" in serve.markdown(results)
    assert set(serve.SAMPLED.values()) <= set(rows) | {"specdec suffix adaptive"}
    # the report names the CPU it ran on: ratios only compare on one kind of machine
    results["machine"] = {"cpu": "Some CPU 9000"}
    assert "2 threads (Some CPU 9000)," in serve.markdown(results)


def _fake_load(record):
    """A ``run_load`` that records ``(port, prompts, n_gen)`` and answers every request with
    ``n_gen`` tokens at once."""
    from specdec.benchmark import serve

    def fake_load(host, port, prompts, *, concurrency, n_gen, n_requests=None, extra=None):
        record.append((port, tuple(prompts), n_gen))
        r = serve.LoadResult(concurrency=concurrency, wall_s=1.0)
        r.samples.append(serve.Sample(ttft_s=0.01, gaps_s=[0.01], n_tokens=n_gen,
                                      latency_s=0.02))
        return r
    return fake_load


def test_benchmark_warms_every_server_with_every_prompt(monkeypatch, tmp_path):
    """Each server takes every prompt once before any timed pass: both servers keep prompts,
    and without it the first row on a server paid the prefill that the rows after it on the
    same server (the sampled rows) skipped."""
    from specdec.benchmark import serve
    import specdec.api
    import specdec.benchmark.llama_tools as lt
    import specdec.models

    calls = []   # (port, prompts, n_gen, timed)

    class FakeServer:
        def __init__(self, argv, port, log):
            self.port = port

        def stop(self):
            pass

    class FakeDecoder:
        drafters = ()

        def __init__(self, *a, **k):
            self.seen = []

        def generate(self, p, max_tokens):
            calls.append(("decoder", (p,), max_tokens))
            st = type("St", (), {"t_prompt_s": 0.01, "n_generated": max_tokens,
                                 "t_generate_s": 0.01})()
            return type("R", (), {"stats": st})()

        def close(self):
            pass

    monkeypatch.setattr(serve, "ServerProcess", FakeServer)
    monkeypatch.setattr(serve, "run_load", _fake_load(calls))
    monkeypatch.setattr(specdec.api, "Decoder", FakeDecoder)
    monkeypatch.setattr(specdec.models, "default_model_path", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(lt, "ensure_tools", lambda names: {n: tmp_path / n for n in names})
    prompts = serve.grounded_prompts()
    serve.run(tmp_path / "out", n_gen=16, reps=1, concurrency=[1], log=lambda s: None)
    timed = [i for i, c in enumerate(calls) if c[2] == 16]
    assert timed
    first_timed = timed[0]
    warm = calls[:first_timed]
    ports = {c[0] for c in warm if c[0] != "decoder"}
    assert len(ports) == len(serve.SPECDEC_DRAFTERS) + len(serve.SPECDEC_ADAPTIVE) + \
        len(serve.LLAMA_SPEC_TYPES) + 2
    for port in ports:   # every server, every prompt, before the first timed pass
        seen = {p for c in warm if c[0] == port for p in c[1]}
        assert seen == set(prompts), port
    assert {c[1][0] for c in warm if c[0] == "decoder"} == set(prompts)


def test_benchmark_gives_each_timed_pass_of_a_drafter_a_fresh_server(monkeypatch, tmp_path):
    """The passes send the same prompts, and a drafter that remembers earlier answers (the
    suffix corpus, ngram-mod) would recall the last pass's: each timed pass of a drafting
    server runs on a server started for it and warmed with every prompt; the plain servers,
    which remember no answer, keep theirs."""
    from specdec.benchmark import serve
    import specdec.api
    import specdec.benchmark.llama_tools as lt
    import specdec.models

    events = []   # ("log", text) | (port, prompts, n_gen) | ("start", port) | ("stop", port)

    class FakeServer:
        def __init__(self, argv, port, log):
            self.port = port
            events.append(("start", port))

        def stop(self):
            events.append(("stop", self.port))

    monkeypatch.setattr(serve, "ServerProcess", FakeServer)
    monkeypatch.setattr(serve, "run_load", _fake_load(events))
    monkeypatch.setattr(specdec.models, "default_model_path", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(lt, "ensure_tools", lambda names: {n: tmp_path / n for n in names})
    prompts = set(serve.grounded_prompts())
    serve.run(tmp_path / "out", n_gen=16, reps=3, concurrency=[4],
              log=lambda s: events.append(("log", s)))
    ports: dict = {}      # row -> the ports of its timed passes
    row = None
    for i, e in enumerate(events):
        if e[0] == "log" and ", pass " in e[1]:
            row = e[1].rsplit(": ", 1)[1]
        elif e[0] not in ("log", "start", "stop") and e[2] == 16:
            ports.setdefault(row, []).append(e[0])
            warmed = {p for w in events[:i] if w[0] == e[0] and w[2] == serve.WARMUP_TOKENS
                      for p in w[1]}
            assert warmed == prompts, row      # every prompt, on this very server
    assert ports and all(len(v) == 3 for v in ports.values())
    for row, got in ports.items():
        server = serve.SAMPLED.get(row, row)
        if server in serve.PLAIN_SERVERS:
            assert len(set(got)) == 1, row
        elif server == row:
            assert len(set(got)) == 3, row     # a new server for each pass
    # a sampled row on a drafting server does not share a server with that row's passes
    sfx = "specdec suffix adaptive"
    assert not set(ports[sfx]) & set(ports[sfx + " t=1"])
    # and every server started was stopped
    started = [e[1] for e in events if e[0] == "start"]
    assert sorted(started) == sorted(e[1] for e in events if e[0] == "stop")
