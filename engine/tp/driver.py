"""Running one engine over `tp_size` tensor-parallel ranks inside a node (SPMD).

Every rank is its own process holding a full `LLMEngine` built with its `TPGroup` (its
shard of every layer, its KV heads of the cache), or a worker's rank around one. The driver
sends each call to all ranks at once; as the scheduler, block manager and sampler are
deterministic and the LM head all-gathers full logits, every rank makes the same decisions
and the collectives inside the forward pass line up. Rank 0's result is returned; the others
reply only "done".

    driver (TPEngine) --call(method, args)--> rank 0 .. rank N-1  (LLMEngine + TPGroup)
                      <---rank 0's result----        \\____ all-reduce / all-gather ____/

A call names a method of the rank's class (`all(LLMEngine.step)`, `all(WorkerRank.reserve,
...)`); here, and only here, it becomes the method's name, to cross into the rank's process,
where `ranks.serve_call` runs that method of the rank's target.

A rank is reached through a `RankHandle`, so the Ray worker can swap the local processes
started here for actors in one placement group and keep everything else.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from core.config import EngineConfig
from core.events import WorkerLoad
from core.kv_layout import KVLayout
from core.lora import LoRARef
from core.request import OutputDelta, RequestOutput
from core.sampling import SamplingParams
from engine.completion import run_to_completion
from engine.config import ModelConfig
from engine.engine import LLMEngine
from engine.tp.ranks import ProcessRank, RankHandle, Reply, free_port

_REPLY_SLICE_S = 0.05
P = ParamSpec("P")
T = TypeVar("T")


def check_tp_size(model: ModelConfig, size: int) -> None:
    """Refuse a TP size the model cannot be split by, before any process starts."""
    if size < 1:
        raise ValueError(f"tp_size must be >= 1, got {size}")
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if heads % size:
        raise ValueError(f"tp_size={size} does not divide the {heads} attention heads")
    if (kv_heads % size) if size < kv_heads else (size % kv_heads):
        raise ValueError(
            f"tp_size={size} must divide the {kv_heads} KV heads or be a multiple of them "
            "(each KV head is then replicated on tp_size / kv_heads ranks)"
        )
    if model.intermediate_size % size:
        raise ValueError(
            f"tp_size={size} does not divide intermediate_size={model.intermediate_size}"
        )


class TPEngine:
    """An `LLMEngine` sharded over `config.tp_size` ranks; same calls, rank 0's answers.

    Calls that change engine state go to every rank (they must stay identical); reads go to
    rank 0 only. A call that fails the same way on every rank (bad input) re-raises rank 0's
    error and the engine stays usable; ranks that disagree leave it broken, and every later
    call raises.
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig,
        worker_id: str = "engine-0",
        *,
        backend: str | None = None,
        master_addr: str = "127.0.0.1",
        port: int | None = None,
        start_timeout_s: float = 300.0,
        call_timeout_s: float = 600.0,
        ranks: Sequence[RankHandle] | None = None,
    ) -> None:
        self.config = config
        self.model_config = ModelConfig.from_dir(model_dir)
        self.call_timeout_s = call_timeout_s
        self._broken: str | None = None
        self._next_id = 0
        if ranks is None:
            ranks = self._start_local(
                model_dir, config, worker_id, backend, master_addr, port, call_timeout_s
            )
        self.ranks = list(ranks)
        replies = [r.reply(start_timeout_s) for r in self.ranks]
        failed = [(i, v) for i, (kind, v) in enumerate(replies) if kind != "ok"]
        if failed:
            self.shutdown()
            rank, error = failed[0]
            raise RuntimeError(f"tensor-parallel rank {rank} failed to start: {error}") from error

    @staticmethod
    def _start_local(
        model_dir: str | Path,
        config: EngineConfig,
        worker_id: str,
        backend: str | None,
        master_addr: str,
        port: int | None,
        timeout_s: float,
    ) -> list[RankHandle]:
        size = config.tp_size
        check_tp_size(ModelConfig.from_dir(model_dir), size)
        if backend is None:
            import torch

            on_gpu = config.device != "cpu" and torch.cuda.is_available()
            backend = "nccl" if on_gpu else "gloo"
        if backend == "nccl":
            import torch

            if torch.cuda.device_count() < size:
                raise ValueError(f"tp_size={size} needs {size} GPUs on this node")
        init_method = f"tcp://{master_addr}:{port or free_port(master_addr)}"
        ctx = mp.get_context("spawn")
        rank_args = (size, init_method, backend, str(model_dir), config, worker_id, timeout_s)
        return [ProcessRank(ctx, rank, rank_args) for rank in range(size)]

    # -- calls ---------------------------------------------------------------------------
    def all(self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `method` on every rank in lockstep; returns rank 0's result."""
        return self._call(self.ranks, method.__name__, args, kwargs, want_result=True)

    def first(
        self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """A read-only call, on rank 0 alone."""
        return self._call(self.ranks[:1], method.__name__, args, kwargs, want_result=True)

    def each(
        self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> list[T]:
        """Run `method` on every rank; every rank's result, in rank order. For per-rank
        state outside the lockstep engine (each rank's KV transport)."""
        name = method.__name__
        return self._call(self.ranks, name, args, kwargs, want_result=True, every=True)

    @property
    def broken(self) -> str | None:
        """Why the engine can no longer be used, or None."""
        return self._broken

    def _call(
        self,
        ranks: list[RankHandle],
        name: str,
        args: tuple,
        kwargs: dict,
        want_result: bool,
        every: bool = False,
    ) -> Any:
        if self._broken:
            raise RuntimeError(f"tensor-parallel engine is broken: {self._broken}")
        for i, r in enumerate(ranks):
            r.submit(name, args, kwargs, want_result and (every or i == 0))
        try:
            replies = self._collect(ranks, name)
        except (TimeoutError, RuntimeError) as e:
            self._broken = f"{name}: {e}"
            raise
        kinds = {kind for kind, _ in replies}
        if kinds == {"ok"}:
            return [v for _, v in replies] if every else replies[0][1]
        errors = [v for kind, v in replies if kind == "error"]
        if kinds == {"error"} and len({type(e) for e in errors}) == 1:
            raise errors[0]  # the same refusal everywhere: state is still identical
        self._broken = f"ranks disagreed on {name}: {replies}"
        raise RuntimeError(f"tensor-parallel engine is broken: {self._broken}")

    def _collect(self, ranks: list[RankHandle], name: str) -> list[Reply]:
        """Every rank's reply, waiting on them in turn for `_REPLY_SLICE_S` each: a rank that
        died is noticed within a slice even while a live rank blocks in a collective with
        it (which would otherwise hold the driver until the call timeout)."""
        deadline = time.monotonic() + self.call_timeout_s
        replies: dict[int, Reply] = {}
        while len(replies) < len(ranks):
            for i, r in enumerate(ranks):
                if i in replies:
                    continue
                try:
                    replies[i] = r.reply(_REPLY_SLICE_S)
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"tensor-parallel rank {i} gave no reply to {name} within "
                            f"{self.call_timeout_s} s"
                        ) from None
        return [replies[i] for i in range(len(ranks))]

    # -- the LLMEngine surface (a worker's rank serves the same names) --------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        lora: LoRARef | None = None,
    ) -> None:
        name = LLMEngine.add_request.__name__
        kwargs = {} if lora is None else {"lora": lora}
        self._call(self.ranks, name, (request_id, prompt, params), kwargs, want_result=False)

    def step(self) -> list[OutputDelta]:
        return self.all(LLMEngine.step)

    def abort(self, request_id: str) -> bool:
        return self.all(LLMEngine.abort, request_id)

    def has_unfinished(self) -> bool:
        return self.first(LLMEngine.has_unfinished)

    def check_invariants(self) -> None:
        self.all(LLMEngine.check_invariants)

    def load(self) -> WorkerLoad:
        """Rank 0's load report: its step totals time the whole group's steps (a rank
        waits in the collectives for the others)."""
        return self.first(LLMEngine.load)

    def kv_layout(self) -> KVLayout:
        """One rank's KV layout: its share of the KV heads (every rank holds as many)."""
        return self.first(LLMEngine.kv_layout)

    def generate(
        self,
        prompts: Sequence[list[int]],
        params: SamplingParams | None = None,
        lora: LoRARef | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion (under the LoRA adapter `lora`, if any); outputs in
        input order (a convenience for tests)."""
        ids = [f"tp-{self._next_id + i}" for i in range(len(prompts))]
        self._next_id += len(ids)
        for rid, prompt in zip(ids, prompts, strict=True):
            self.add_request(rid, prompt, params, lora)
        outputs = run_to_completion(self, dict(zip(ids, prompts, strict=True)))
        return [outputs[rid] for rid in ids]

    def shutdown(self, timeout_s: float = 30.0) -> None:
        for r in self.ranks:
            r.close(timeout_s)
        self.ranks = []
        self._broken = self._broken or "shut down"

    def __enter__(self) -> TPEngine:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
