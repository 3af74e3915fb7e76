#!/usr/bin/env python3
"""Find what a ``-Dcuda=true`` build needs, where users have it: the toolkit (nvcc's, with
``$CUDA_PATH`` and ``/usr/local/cuda``), and the libraries the toolkit may lack (cuBLAS,
cudart) in NVIDIA's pip wheels (``nvidia-cublas``, ``nvidia-cuda-runtime``: PyTorch installs
the same ones), and the GPU of this machine for the default architecture.

Why a script: ggml's CMake links ``CUDA::cublas`` from the toolkit only, so a toolkit without
cuBLAS (CUDA 13 images often ship it as a separate package) fails at configure time with
"target was not found". Here the wheel's files are handed to CMake instead: the libraries as
``CUDA_<lib>_LIBRARY`` cache entries, the headers through a folder of links to just those
headers (the wheel's ``include/`` may also hold a newer cudart's headers than nvcc's, which must
not shadow the toolkit's).

``meson.build`` runs it at configure time (``python tools/find_cuda.py NVCC BUILD_DIR``) and
reads ``key<TAB>value`` lines; :func:`find` is also what ``tests/test_cuda_build.py`` runs against a
fake toolkit layout. Standard library only (the build's Python, before specdec is built).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

#: the libraries ggml-cuda links (cuBLAS needs cuBLASLt), by the wheel that ships each
WHEEL_LIBS = {"cublas": "nvidia-cublas", "cublasLt": "nvidia-cublas",
              "cudart": "nvidia-cuda-runtime"}
#: the headers ggml-cuda includes from cuBLAS
CUBLAS_HEADERS = ("cublas.h", "cublas_v2.h", "cublas_api.h", "cublasLt.h", "cublasXt.h")
#: the architectures of a build on a machine with no GPU to ask (CMake's form): ggml's own
#: portable list for CUDA 12.8+ (PTX for Turing and Ampere, SASS for the RTX 3000/4000 and
#: Blackwell cards) with Hopper's SASS added, the data-centre GPU users rent most
DEFAULT_ARCHS = "75-virtual;80-virtual;86-real;89-real;90-real;120a-real"


#: where a toolkit is looked for after $CUDA_PATH/$CUDA_HOME and nvcc's own
DEFAULT_ROOTS = ("/usr/local/cuda",)


def toolkit_roots(nvcc: str, env: Optional[Dict[str, str]] = None) -> List[str]:
    """$CUDA_PATH, $CUDA_HOME, the toolkit nvcc is in (nvcc may be a link), then
    ``DEFAULT_ROOTS``: in order, existing, without repeats."""
    env = os.environ if env is None else env
    roots = [env.get("CUDA_PATH", ""), env.get("CUDA_HOME", ""),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), *DEFAULT_ROOTS]
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


def _lib_dirs(root: str) -> List[str]:
    return [d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib"),
                        *glob.glob(os.path.join(root, "targets", "*-linux", "lib")))
            if os.path.isdir(d)]


def _find_lib(dirs: Iterable[str], name: str) -> Optional[str]:
    """``lib<name>.so`` (the development link), else the versioned runtime file a wheel ships
    (``lib<name>.so.13``): CMake links a full path whatever its name."""
    for d in dirs:
        plain = os.path.join(d, f"lib{name}.so")
        if os.path.exists(plain):
            return plain
        versioned = sorted(glob.glob(os.path.join(d, f"lib{name}.so.[0-9]*")), key=len)
        if versioned:
            return versioned[0]
    return None


def wheel_roots(paths: Iterable[str]) -> List[str]:
    """The ``nvidia/<part>`` folders of NVIDIA's wheels on these import paths: ``cu13``/``cu12``
    (one folder per CUDA major, the newer wheels) and ``cublas``/``cuda_runtime`` (older)."""
    out = []
    for p in paths:
        base = os.path.join(p, "nvidia")
        if not os.path.isdir(base):
            continue
        for part in sorted(os.listdir(base), reverse=True):   # cu13 before cu12
            full = os.path.join(base, part)
            if os.path.isdir(os.path.join(full, "lib")):
                out.append(full)
    return list(dict.fromkeys(out))


def gpu_arch(run=subprocess.run) -> Optional[str]:
    """The compute capability of this machine's first GPU as CMake writes it ("90"), from
    nvidia-smi; None without a GPU or a driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                  capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    caps = [c.strip() for c in out.splitlines() if c.strip().replace(".", "").isdigit()]
    return caps[0].replace(".", "") if caps else None


def find(nvcc: str, build_dir: str, paths: Optional[Iterable[str]] = None,
         env: Optional[Dict[str, str]] = None, arch=gpu_arch) -> Dict[str, str]:
    """What the build passes on to CMake and records for the runtime:

    - ``cmake:CUDA_<lib>_LIBRARY``: a library the toolkit lacks, from a wheel;
    - ``include``: a folder of links to the wheel's cuBLAS headers (only if they came from it);
    - ``rpath``: the folders the extension loads cuBLAS/cudart from at run time (``:``-joined):
      the toolkit's, else the wheel's folder relative to the installed extension;
    - ``archs``: this machine's GPU ("90"), else ``DEFAULT_ARCHS``;
    - ``missing``: libraries found nowhere (the build then fails with this list).
    """
    paths = sys.path if paths is None else paths
    roots = toolkit_roots(nvcc, env)
    tk_dirs = [d for r in roots for d in _lib_dirs(r)]
    tk_incs = [os.path.join(r, "include") for r in roots]
    wheels = wheel_roots(paths)
    w_dirs = [os.path.join(w, "lib") for w in wheels]
    out: Dict[str, str] = {}
    rpath: List[str] = []
    missing = []
    for lib in WHEEL_LIBS:
        in_tk = _find_lib(tk_dirs, lib)
        if in_tk:
            rpath.append(os.path.dirname(os.path.realpath(in_tk)))
            continue
        in_wheel = _find_lib(w_dirs, lib)
        if in_wheel is None:
            missing.append(f"{lib} ({WHEEL_LIBS[lib]})")
            continue
        out[f"cmake:CUDA_{lib}_LIBRARY"] = in_wheel
        # the build's wheels may live in a throw-away build environment: the installed
        # extension looks beside itself, in the site-packages that has the same wheel
        part = os.path.basename(os.path.dirname(os.path.dirname(in_wheel)))
        rpath.append(f"$ORIGIN/../nvidia/{part}/lib")
    if not any(os.path.exists(os.path.join(i, "cublas_v2.h")) for i in tk_incs):
        src = next((os.path.join(w, "include") for w in wheels
                    if os.path.exists(os.path.join(w, "include", "cublas_v2.h"))), None)
        if src is None:
            missing.append("cublas_v2.h (nvidia-cublas)")
        else:
            inc = os.path.join(build_dir, "cuda-wheel-include")
            os.makedirs(inc, exist_ok=True)
            for h in CUBLAS_HEADERS:
                s, d = os.path.join(src, h), os.path.join(inc, h)
                if os.path.exists(s):
                    if os.path.lexists(d):
                        os.remove(d)
                    os.symlink(s, d)
            out["include"] = inc
    # then the toolkit's own folders: a machine whose toolkit has what the build's lacked
    rpath += [os.path.realpath(d) for d in tk_dirs]
    out["rpath"] = ":".join(dict.fromkeys(rpath))
    out["archs"] = (arch() if callable(arch) else arch) or DEFAULT_ARCHS
    out["roots"] = ":".join(roots)
    if missing:
        out["missing"] = ", ".join(missing)
    return out


def main(argv: List[str]) -> int:
    nvcc, build_dir = argv[1], argv[2]
    for k, v in find(nvcc, build_dir).items():
        print(f"{k}\t{v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
