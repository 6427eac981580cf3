"""The ranks of a tensor-parallel engine: how one is started, joins the group and serves
the driver's calls (`rank_main`), and how the driver reaches it (`RankHandle`; `ProcessRank`
for local processes, a Ray actor wrapper later).

Wire protocol over the handle: the driver sends `(method, args, kwargs, want_result)` or
None (stop); the rank answers `("ok", result or None)` or `("error", exception)`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import traceback
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


def _portable(error: BaseException) -> BaseException:
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
) -> None:
    """Body of a rank process: join the group, build the engine, serve calls until told to
    stop (None) or the driver goes away."""
    try:
        if backend == "gloo" and "127.0.0.1" in init_method:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)  # before the group: NCCL binds the current device
        from engine.engine import LLMEngine

        group = init_tp_group(rank, size, init_method, backend, timeout_s)
        engine = LLMEngine(model_dir, config, tp=group, worker_id=worker_id)
    except BaseException as e:  # report why this rank never came up, then exit
        conn.send(("error", _portable(e)))
        return
    conn.send(("ok", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        name, args, kwargs, want_result = message
        try:
            result = getattr(engine, name)(*args, **kwargs)
            conn.send(("ok", result if want_result else None))
        except Exception as e:
            conn.send(("error", _portable(e)))
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
