"""The ranks of a tensor-parallel engine: how one is started, joins the group and serves
the driver's calls (`rank_main`), and how the driver reaches it (`RankHandle`; `ProcessRank`
for local processes; the worker packages wrap Ray actors the same way).

Wire protocol over the handle: the driver sends `(method, args, kwargs, want_result)` or
None (stop); the rank answers `("ok", result or None)` or `("error", exception)`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import socket
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.config import EngineConfig

Reply = tuple[str, Any]  # ("ok", result) | ("error", exception)


def init_tp_group(rank: int, size: int, init_method: str, backend: str, timeout_s: float):
    """Join the process group of this node's ranks; returns this rank's `TPGroup`."""
    import torch.distributed as dist

    from engine.parallel import TPGroup

    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip
    return TPGroup(rank, size, dist.group.WORLD)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def portable_error(error: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(error))
        return RuntimeError(f"{type(error).__name__} on a tensor-parallel rank:\n{text}")


class RankHandle(Protocol):
    """One rank as the driver sees it: submit a call, then collect its reply."""

    def submit(self, name: str, args: tuple, kwargs: dict, want_result: bool) -> None: ...
    def reply(self, timeout_s: float) -> Reply: ...
    def close(self, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class RankStart:
    """How one rank comes up: join the process group, then build its target with
    `factory(tp=group)` (an `LLMEngine`, or a worker's rank that wraps one)."""

    rank: int
    size: int
    init_method: str
    backend: str
    """gloo or nccl."""
    timeout_s: float
    factory: Callable[..., Any]


def visible_device_index(assigned_gpu_ids: Sequence[int | str], visible_devices: str | None) -> int:
    """The CUDA device index of the one GPU a scheduler (Ray) assigned this process.

    The scheduler names GPUs as the node does: physical ids, or the entries of the node's
    own CUDA_VISIBLE_DEVICES (ids or UUIDs) when it was started with one. CUDA numbers the
    devices this process sees 0, 1, ... in the order of `visible_devices`, so the index is
    the id's position there; without a visible list every GPU is seen and the id is the
    index. A visible list narrowed to the one GPU (Ray's default) gives 0 the same way.

        CUDA_VISIBLE_DEVICES="2,3,5", assigned ["5"]  ->  device 2
        unset,                        assigned [5]    ->  device 5
    """
    if len(assigned_gpu_ids) != 1:
        raise RuntimeError(
            f"a tensor-parallel rank needs exactly one GPU, got {list(assigned_gpu_ids)}"
        )
    gpu = str(assigned_gpu_ids[0]).strip()
    if visible_devices is None:
        if not gpu.isdigit():
            raise RuntimeError(
                f"GPU {gpu!r} is not a device number and CUDA_VISIBLE_DEVICES is unset"
            )
        return int(gpu)
    visible = [d.strip() for d in visible_devices.split(",") if d.strip()]
    if gpu not in visible:
        raise RuntimeError(
            f"GPU {gpu} assigned to this rank is not visible to it "
            f"(CUDA_VISIBLE_DEVICES={visible_devices!r})"
        )
    return visible.index(gpu)


def build_rank(start: RankStart, device_index: int | None = None) -> Any:
    """Join the group and build the rank's target. `device_index` is the CUDA device of
    this rank (default: the rank, as for local processes that see every GPU of the node;
    a Ray rank passes `visible_device_index` of the GPU Ray assigned it)."""
    if start.backend == "gloo" and "127.0.0.1" in start.init_method:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if start.backend == "nccl":
        import torch

        torch.cuda.set_device(start.rank if device_index is None else device_index)
    group = init_tp_group(start.rank, start.size, start.init_method, start.backend, start.timeout_s)
    return start.factory(tp=group)


def serve_call(target: Any, name: str, args: tuple, kwargs: dict, want_result: bool) -> Reply:
    """Run one driver call on this rank's target: the public method `name` of its class (the
    driver named it by the method, driver.py)."""
    try:
        if name.startswith("_") or not callable(getattr(type(target), name, None)):
            raise AttributeError(f"{type(target).__name__} has no rank method {name!r}")
        result = getattr(target, name)(*args, **kwargs)
        return ("ok", result if want_result else None)
    except Exception as e:
        return ("error", portable_error(e))


def engine_factory(model_dir: str, config: EngineConfig, worker_id: str) -> Callable[..., Any]:
    """The default rank target: a bare `LLMEngine` shard."""
    from engine.engine import LLMEngine

    return functools.partial(LLMEngine, model_dir, config, worker_id=worker_id)


def rank_main(
    rank: int,
    size: int,
    init_method: str,
    backend: str,
    model_dir: str,
    config: EngineConfig,
    worker_id: str,
    timeout_s: float,
    conn: Any,
    factory: Callable[..., Any] | None = None,
) -> None:
    """Body of a rank process: join the group, build the engine, serve calls until told to
    stop (None) or the driver goes away."""
    try:
        factory = factory or engine_factory(model_dir, config, worker_id)
        target = build_rank(RankStart(rank, size, init_method, backend, timeout_s, factory))
    except BaseException as e:  # report why this rank never came up, then exit
        conn.send(("error", portable_error(e)))
        return
    conn.send(("ok", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        conn.send(serve_call(target, *message))
    import torch.distributed as dist

    dist.destroy_process_group()


class ProcessRank:
    """A rank in a local process started with `spawn`, reached over a pipe."""

    def __init__(self, ctx: Any, rank: int, rank_args: tuple) -> None:
        self.rank = rank
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=rank_main, args=(rank, *rank_args, child), name=f"baton-tp-rank{rank}",
            daemon=True,
        )  # fmt: skip
        self.process.start()
        child.close()  # so a dead rank shows as EOF here instead of a silent wait

    def submit(self, name: str, args: tuple, kwargs: dict, want_result: bool) -> None:
        self._conn.send((name, args, kwargs, want_result))

    def reply(self, timeout_s: float) -> Reply:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"tensor-parallel rank {self.rank} gave no reply in {timeout_s} s")
        try:
            return self._conn.recv()
        except EOFError:
            code = self.process.exitcode
            raise RuntimeError(
                f"tensor-parallel rank {self.rank} died (exit code {code})"
            ) from None

    def close(self, timeout_s: float) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):  # the rank may be gone already
            self._conn.send(None)
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()  # our own child, by handle
            self.process.join(timeout_s)
        self._conn.close()
