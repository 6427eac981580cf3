"""Registry of transport backends and the one factory, `create_transport`.

`auto` starts one transport per usable backend and picks per peer (kv_transfer.paired):
`shm` for a peer on this host (CPU caches), else the first network backend that works here,
`nixl` (zero-copy READs, peer-failure detection, VRAM) before `ucx`, else `cuda_ipc` for a
GPU peer on this host. What was started and why a backend is unavailable are logged.
`local` (same-process peers only) is used only by name.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from core.cache_dir import cache_dir
from core.kv_layout import KVLayout, dtype_name
from kv_transfer.api import FailureHook, Transport
from kv_transfer.driver import Driver, DriverError
from kv_transfer.env import apply_ucx_defaults
from kv_transfer.paired import NETWORK_BACKENDS, PairedTransport
from kv_transfer.transport import DriverTransport

logger = logging.getLogger(__name__)

DriverClass = Callable[[torch.Tensor, KVLayout, str], Driver]

# name -> (module:class of the driver, module whose import proves the backend is installed)
_BACKENDS: dict[str, tuple[str, str]] = {
    "nixl": ("kv_transfer.nixl_driver:NixlDriver", "nixl._api"),
    "ucx": ("kv_transfer.ucx_driver:UcxDriver", "ucxx._lib.libucxx"),
    "shm": ("kv_transfer.shm_driver:ShmDriver", "mmap"),
    "cuda_ipc": ("kv_transfer.cuda_ipc_driver:CudaIpcDriver", "torch"),
    "local": ("kv_transfer.local_driver:LocalDriver", "torch"),
}


def register_backend(name: str, driver_path: str, requires: str) -> None:
    """Add a backend: `driver_path` is 'module:Class' of a Driver, `requires` a module
    that must import for it to be usable."""
    _BACKENDS[name] = (driver_path, requires)


def backend_names() -> list[str]:
    return list(_BACKENDS)


@functools.cache
def unavailable_reason(name: str) -> str | None:
    """None if backend `name` can be used here, else why not.

    The probe imports the backend in a child process: the nixl and ucxx wheels each bundle
    their own UCX, and a process that loads both aborts, so a process imports only the
    backend it actually uses. The child costs seconds of CPU (nixl imports torch), and a
    worker that starts while the others serve takes them from them, so a verdict is kept
    per machine (`probe_verdicts`) for as long as the package it probed stays installed.
    """
    if name not in _BACKENDS:
        return f"unknown backend {name!r}; known: {sorted(_BACKENDS)}"
    module = _BACKENDS[name][1]
    if module in sys.modules:
        return None
    package = module.partition(".")[0]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:
        return f"{package} cannot be found: {exc}"
    if spec is None:
        return f"{package} is not installed"
    key = _install_key(module, spec)
    verdicts = _read_verdicts()
    if key in verdicts:
        return verdicts[key]
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probing {module} failed: {exc}"  # not kept: a busy host may time out
    reason = None
    if probe.returncode != 0:  # a broken binary wheel fails in more ways than ImportError
        lines = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
        reason = f"{module} does not import: {lines[-1]}"
    _write_verdict(key, reason)
    return reason


def probe_verdicts() -> Path:
    """The file of kept probe verdicts: {install key: None or why the import failed}."""
    return cache_dir("kv-transport") / "probes.json"


def _install_key(module: str, spec: importlib.machinery.ModuleSpec) -> str:
    """The interpreter, the module and where its package lies, with that file's size and
    modification time: installing the package again (or another interpreter) is a new key."""
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    try:
        stat = os.stat(where)
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return f"{sys.executable}|{module}|{where}|{stamp}"


def _read_verdicts() -> dict[str, str | None]:
    try:
        verdicts = json.loads(probe_verdicts().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return verdicts if isinstance(verdicts, dict) else {}


def _write_verdict(key: str, reason: str | None) -> None:
    """Best effort (an unwritable cache only costs the next process its own probe); the file
    is replaced whole, so a reader never sees half of it."""
    path = probe_verdicts()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        verdicts = _read_verdicts() | {key: reason}
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=".probes-", suffix=".json", delete=False
        ) as f:
            json.dump(verdicts, f, indent=1)
        os.replace(f.name, path)
    except OSError as exc:
        logger.debug("probe verdict for %s not kept: %s", key, exc)


def select_backend(requested: str) -> str:
    """Check that an explicitly named backend can be used here, and log the choice."""
    reason = unavailable_reason(requested)
    if reason is not None:
        raise ValueError(f"KV transport backend {requested!r} unavailable: {reason}")
    logger.info("KV transport: %s (requested explicitly)", requested)
    return requested


def _driver_class(name: str) -> DriverClass:
    module_name, class_name = _BACKENDS[name][0].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def create_transport(
    kv: torch.Tensor,
    layout: KVLayout,
    model_id: str,
    backend: str = "auto",
    name: str | None = None,
    on_failure: FailureHook | None = None,
    loopback: bool = False,
    block_copy: Any = None,
    require_network: bool = False,
) -> Transport:
    """Register `kv` (shaped as `layout` describes) with a backend and start its transport.

    `backend="auto"` picks per peer (kv_transfer.paired): `shm` on this host (CPU caches),
    the first of nixl, ucx that works here for the others, `cuda_ipc` on this host (GPU
    caches) where neither does; `require_network` makes a missing network backend an error
    now (a worker of a multi-host cluster), naming each backend and why it is unavailable.
    Where none starts at all, the worker gets a transport of none (kv_transfer.paired): it
    moves no KV, and a peer is refused naming why. A named backend is used for every peer.

    `model_id` goes into the handshake; `loopback=True` keeps UCX's TCP on 127.0.0.1 (a
    single-node cluster, tests); `on_failure` is the FailureHook that releases blocks;
    `block_copy` the compiled block copy the shm backend uses when given (kv_transfer builds
    no native code itself: the caller hands it `engine.cpu_kernels.load("copy_blocks")`)."""
    if tuple(kv.shape) != layout.shape:
        raise ValueError(f"KV tensor shape {tuple(kv.shape)} != layout shape {layout.shape}")
    if dtype_name(kv.dtype) != layout.dtype:
        raise ValueError(f"KV tensor dtype {dtype_name(kv.dtype)} != layout dtype {layout.dtype}")
    if not kv.is_contiguous():
        raise ValueError("KV tensor must be contiguous: it is registered as one region")
    name = name or f"kv-{os.getpid()}-{random.getrandbits(32):08x}"

    def start(chosen: str) -> Transport:
        if chosen in NETWORK_BACKENDS:
            apply_ucx_defaults(loopback=loopback)
        driver_class = _driver_class(chosen)
        options = {"block_copy": block_copy} if chosen == "shm" else {}
        return DriverTransport(
            lambda agent_name: driver_class(kv, layout, agent_name, **options),
            layout,
            model_id,
            name=name,
            on_failure=on_failure,
        )

    if backend != "auto":
        return start(select_backend(backend))
    transports: dict[str, Transport] = {}
    unavailable: dict[str, str] = {}
    same_host = "cuda_ipc" if kv.is_cuda else "shm"
    unavailable["cuda_ipc" if same_host == "shm" else "shm"] = (
        f"the cache is in {'GPU' if kv.is_cuda else 'host'} memory"
    )
    # Refused: a cache not in shared memory, a GPU without IPC, a sandbox without the /proc
    # entries a host is named by (kv_transfer/host.py).
    try:
        transports[same_host] = start(same_host)
    except (DriverError, ValueError, RuntimeError, OSError) as exc:
        unavailable[same_host] = str(exc)
    for network in NETWORK_BACKENDS:
        reason = unavailable_reason(network)
        if reason is None:
            transports[network] = start(network)
            break
        unavailable[network] = reason
    if require_network and not transports.keys() & set(NETWORK_BACKENDS):
        for transport in transports.values():
            transport.close()
        why = "; ".join(f"{b}: {reason}" for b, reason in unavailable.items())
        raise RuntimeError(f"no KV transport reaches workers on other hosts ({why})")
    if not transports:  # it serves what moves no KV; a peer is refused, naming why
        logger.warning(
            "KV transport %s: none, this worker moves no KV (%s)",
            name,
            "; ".join(f"{b}: {reason}" for b, reason in unavailable.items()),
        )
        return PairedTransport({}, unavailable, name=name or f"kv-{os.getpid()}-none")
    logger.info(
        "KV transport %s: %s per peer%s",
        name,
        " / ".join(transports),
        "".join(f"; {b} unavailable: {r}" for b, r in unavailable.items()),
    )
    return PairedTransport(transports, unavailable)
