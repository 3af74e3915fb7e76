"""Where a model's layers go: llama.cpp's placement options, checked before anything loads.

The names follow llama.cpp (``-ngl``, ``--split-mode``, ``--main-gpu``, ``--tensor-split``,
``--rpc``) and llama-cpp-python (``n_gpu_layers``, ``split_mode``, ``main_gpu``,
``tensor_split``, ``rpc_servers``). The core turns a :class:`Placement` into llama.cpp's
device list; this module only validates and normalises the user's values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

#: llama.cpp's ``enum llama_split_mode``
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}

RpcServers = Union[str, Sequence[str], None]


def parse_rpc_servers(servers: RpcServers) -> Tuple[str, ...]:
    """``"host:port,host:port"`` or a list of ``host:port`` -> a tuple of endpoints.

    Hosts may be names, IPv4 addresses or bracketed IPv6 addresses (``[::1]:50052``).
    """
    if servers is None:
        return ()
    if isinstance(servers, str):
        items = servers.split(",") if servers.strip() else []
    elif isinstance(servers, (list, tuple)):
        items = list(servers)
    else:
        raise TypeError(f"rpc_servers must be a 'host:port,...' string or a list of them, "
                        f"got {type(servers).__name__}")
    out: List[str] = []
    for s in items:
        if not isinstance(s, str):
            raise TypeError(f"an RPC server must be a 'host:port' string, got {type(s).__name__}")
        s = s.strip()
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RPC server {s!r} is not 'host:port' (port 1-65535)")
        if any(c.isspace() for c in host) or host.count(":") and not (host.startswith("[")
                                                                     and host.endswith("]")):
            raise ValueError(f"RPC server {s!r}: bad host (write IPv6 addresses as [addr]:port)")
        if s in out:
            raise ValueError(f"RPC server {s!r} is listed twice")
        out.append(s)
    return tuple(out)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Placement:
    """A model's placement. ``n_gpu_layers``: layers on devices (-1: all, 0: none; the
    output layer counts as one more, as in llama.cpp); ``split_mode``: how several devices
    share them; ``main_gpu``: the device for ``split_mode="none"``; ``tensor_split``: each
    device's share; ``rpc_servers``: remote devices, placed before local ones."""
    n_gpu_layers: int = 0
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: Tuple[float, ...] = ()
    rpc_servers: Tuple[str, ...] = ()
    rpc_timeout: float = 300.0

    @classmethod
    def make(cls, n_gpu_layers: int = 0, split_mode: Union[str, int] = "layer",
             main_gpu: int = 0, tensor_split: Optional[Sequence[float]] = None,
             rpc_servers: RpcServers = None, rpc_timeout: Optional[float] = 300.0) -> "Placement":
        ngl = _int("n_gpu_layers", n_gpu_layers)
        if ngl < -1:
            ngl = -1
        if isinstance(split_mode, int) and not isinstance(split_mode, bool):
            names = {v: k for k, v in SPLIT_MODES.items()}
            if split_mode not in names:
                raise ValueError(f"split_mode {split_mode} is not one of {sorted(names)}")
            split_mode = names[split_mode]
        if not isinstance(split_mode, str) or split_mode.lower() not in SPLIT_MODES:
            raise ValueError(f"split_mode must be one of {list(SPLIT_MODES)}, got {split_mode!r}")
        mg = _int("main_gpu", main_gpu)
        if mg < 0:
            raise ValueError(f"main_gpu must be >= 0, got {mg}")
        ts: Tuple[float, ...] = ()
        if tensor_split is not None:
            if isinstance(tensor_split, (str, bytes)) or not hasattr(tensor_split, "__iter__"):
                raise TypeError("tensor_split must be a list of numbers")
            try:
                ts = tuple(float(x) for x in tensor_split)
            except (TypeError, ValueError):
                raise TypeError("tensor_split must be a list of numbers") from None
            if any(not math.isfinite(x) or x < 0 for x in ts) or (ts and sum(ts) <= 0):
                raise ValueError(f"tensor_split must be non-negative numbers with a positive "
                                 f"sum, got {list(ts)}")
        if rpc_timeout is None:
            timeout = 0.0
        else:
            if isinstance(rpc_timeout, bool) or not isinstance(rpc_timeout, (int, float)) \
                    or not rpc_timeout > 0:
                raise ValueError(f"rpc_timeout must be a positive number of seconds or None, "
                                 f"got {rpc_timeout!r}")
            timeout = float(rpc_timeout)
        return cls(ngl, split_mode.lower(), mg, ts, parse_rpc_servers(rpc_servers), timeout)

    @property
    def split_mode_id(self) -> int:
        return SPLIT_MODES[self.split_mode]

    def options(self) -> Dict[str, Any]:
        """Keyword arguments for ``Model`` that give this placement."""
        return {"n_gpu_layers": self.n_gpu_layers, "split_mode": self.split_mode,
                "main_gpu": self.main_gpu, "tensor_split": list(self.tensor_split) or None,
                "rpc_servers": list(self.rpc_servers) or None,
                "rpc_timeout": self.rpc_timeout or None}


def draft_options(target_placement: Optional[Placement],
                  n_gpu_layers: Optional[int]) -> Dict[str, Any]:
    """``Model`` keyword arguments for a drafter's own model (a draft model, an MTP head
    file): the target's placement, with the drafter's ``n_gpu_layers`` (llama.cpp's
    ``-ngld``) when given. With no layers on devices the RPC servers are not used."""
    opts = target_placement.options() if target_placement is not None else {}
    if n_gpu_layers is not None:
        opts["n_gpu_layers"] = _int("n_gpu_layers", n_gpu_layers)
    if opts.get("n_gpu_layers", 0) == 0:
        opts.pop("rpc_servers", None)
        opts.pop("tensor_split", None)
    return opts
