"""The synthetic benchmark models: bigram qwen35 (and its MoE variant) whose MTP head is
right a chosen share of the time, EAGLE-3 drafts of such a target (likewise dialled), DFlash
drafts of a periodic bigram target (an exact dial), and a random "mid" Mamba-2 (rollback by
checkpoints).

``specdec.testing.write_bigram_mtp_model`` scales one fixed, seeded Gaussian draw on
the head's ``eh_proj`` by ``noise``; ``calibrate`` finds, in numpy, the noise that
gives each target first-draft accuracy, and ``models`` writes each model once into
the cache (``<cache>/bench-mtp/<size>``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Dict, Sequence

import numpy as np

from ..cache import cache_dir
from ..testing import write_bigram_mtp_model
from ..testing.dflash import write_dflash_draft
from ..testing.eagle3 import noise_for_acceptance, write_eagle3_draft
from ..testing.tiny import Mamba2Dims, add_mamba2_kv, mamba2_layout, write_random

#: vocab 8192, n_embd 512, 8 layers, Q8_0: big enough that a verify's checkpoint save and
#: restore cost what they cost on a real recurrent model
MID_MAMBA2 = Mamba2Dims(n_vocab=8192, n_embd=512, n_layer=8, d_inner=1024, d_state=64, n_head=16)


def bench_dir(size: str) -> Path:
    d = cache_dir() / "bench-mtp" / size
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_once(path: Path, **kw) -> Path:
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_bigram_mtp_model(tmp, **kw)
        os.replace(tmp, path)
    return path


def _prefix(arch: str) -> str:
    return "" if arch == "qwen35" else f"{arch}-"   # qwen35 keeps the first file names


def calibrate(size: str, targets: Sequence[float], n_samples: int = 512, arch: str = "qwen35",
              log: Callable[[str], None] = print) -> Dict[float, float]:
    """Noise level giving each target first-draft accuracy, found by bisection in numpy.

    A model written with noise 1 holds the draw G (``eh_proj - [I | 0]``) and every
    other level's head is ``[I | 0] + noise * G``, so no model is written per trial.
    Results are cached next to the models.
    """
    from ..testing.bigram import _rmsnorm, _successor, _Tensors

    memo_path = bench_dir(size) / f"{_prefix(arch)}calibration.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    want = [t for t in targets if f"{t}:{n_samples}" not in memo]
    if want:
        path = write_once(bench_dir(size) / f"{_prefix(arch)}noise-unit.gguf", size=size,
                          noise=1.0, arch=arch)
        ts = _Tensors(path)
        p = f"blk.{ts.n_layer}.nextn."
        embd, out = ts["token_embd.weight"], ts["output.weight"]
        n = embd.shape[1]
        base = np.zeros((n, 2 * n), dtype=np.float32)
        base[:, :n] = np.eye(n, dtype=np.float32)
        g = ts[p + "eh_proj.weight"] - base
        x0 = np.random.default_rng(0).integers(0, embd.shape[0], size=n_samples)
        x1 = _successor(ts, x0)
        x2 = _successor(ts, x1)
        h = _rmsnorm(_rmsnorm(embd[x0], ts["output_norm.weight"]), ts[p + "hnorm.weight"])
        e = _rmsnorm(embd[x1], ts[p + "enorm.weight"])
        inp = np.concatenate([e, h], axis=1)
        head_norm = ts.get(p + "shared_head_norm.weight", "output_norm.weight")

        def accuracy(noise: float) -> float:
            cur = _rmsnorm(inp @ (base + np.float32(noise) * g).T, head_norm)
            return float(np.mean(np.argmax(cur @ out.T, axis=-1) == x2))

        for target in want:
            lo, hi = 0.0, 1.0
            for _ in range(20):
                mid = (lo + hi) / 2
                if accuracy(mid) > target:
                    lo = mid
                else:
                    hi = mid
            memo[f"{target}:{n_samples}"] = round((lo + hi) / 2, 5)
            log(f"accuracy {target:.0%}: noise {memo[f'{target}:{n_samples}']}")
        tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(memo, indent=1))
        os.replace(tmp, memo_path)
    return {t: memo[f"{t}:{n_samples}"] for t in targets}


def models(size: str, noises: Dict[float, float], arch: str = "qwen35",
           dtype: str = "") -> Dict[float, Path]:
    """Write (once) one model per accuracy; returns ``{accuracy: path}``.

    ``dtype`` (e.g. ``"q8_0"``) overrides the size's default weight type; the head noise
    is calibrated on the float weights, and quantization moves the accuracy by a point or two.
    """
    tag = f"-{dtype}" if dtype else ""
    return {acc: write_once(bench_dir(size) / f"{_prefix(arch)}noise-{noise}{tag}.gguf", size=size,
                            noise=noise, arch=arch, dtype=dtype or None)
            for acc, noise in noises.items()}


def model_for(size: str, accuracy: float, arch: str = "qwen35", dtype: str = "",
              log: Callable[[str], None] = print) -> Path:
    return models(size, calibrate(size, (accuracy,), arch=arch, log=log), arch=arch,
                  dtype=dtype)[accuracy]


#: the bigram target the EAGLE-3 cases draft for (its own MTP head is not used there)
EAGLE3_TARGET_ACCURACY = 0.9


def eagle3_draft_for(target: str | os.PathLike[str], size: str, accuracy: float,
                     dtype: str = "", log: Callable[[str], None] = print) -> Path:
    """An EAGLE-3 draft of ``target`` whose first draft is right ``accuracy`` of the time,
    written once into the cache; the noise is calibrated in numpy and remembered."""
    memo_path = bench_dir(size) / "eagle3-calibration.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    key = f"{Path(target).name}:{accuracy}"
    if key not in memo:
        memo[key] = 0.0 if accuracy >= 1.0 else round(noise_for_acceptance(target, accuracy), 5)
        log(f"EAGLE-3 accuracy {accuracy:.0%}: noise {memo[key]}")
        tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(memo, indent=1))
        os.replace(tmp, memo_path)
    tag = f"-{dtype}" if dtype else ""
    path = bench_dir(size) / f"eagle3-{Path(target).stem}-noise-{memo[key]}{tag}.gguf"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_eagle3_draft(tmp, target, noise=memo[key], dtype=dtype or ("f16" if size == "mid"
                                                                         else "f32"))
        os.replace(tmp, path)
    return path


#: the period of the bigram target the DFlash cases draft for: its greedy text repeats every
#: DFLASH_PERIOD tokens, and the draft's block holds DFLASH_PERIOD - 1 draft tokens
DFLASH_PERIOD = 16


def dflash_target(size: str, dtype: str = "") -> Path:
    """The periodic bigram target of the DFlash cases, written once into the cache."""
    tag = f"-{dtype}" if dtype else ""
    return write_once(bench_dir(size) / f"period-{DFLASH_PERIOD}{tag}.gguf", size=size,
                      period=DFLASH_PERIOD, dtype=dtype or None)


def dflash_draft_for(target: str | os.PathLike[str], size: str, accuracy: float,
                     dtype: str = "") -> Path:
    """A DFlash draft of the periodic ``target`` that is right on ``accuracy`` of every
    cycle's tokens, written once into the cache."""
    tag = f"-{dtype}" if dtype else ""
    path = bench_dir(size) / f"dflash-{Path(target).stem}-acc-{accuracy}{tag}.gguf"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_dflash_draft(tmp, target, acceptance=accuracy,
                           dtype=dtype or ("f16" if size == "mid" else "f32"))
        os.replace(tmp, path)
    return path


def mid_mamba2() -> Path:
    """The mid Mamba-2 (:data:`MID_MAMBA2`, random weights), written once into the cache."""
    path = cache_dir() / "bench-mamba2-mid-q8_0.gguf"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_random(tmp, "mamba2", mamba2_layout(MID_MAMBA2),
                     lambda w: add_mamba2_kv(w, MID_MAMBA2), n_vocab=MID_MAMBA2.n_vocab, seed=3,
                     dtype="q8_0", name="mid-mamba2")
        os.replace(tmp, path)
    return path
