"""The routing-policy interface: one call per decision, pure apart from the policy's own
tie-break / round-robin state.

    policy.choose(ctx) -> Choice

`ctx.workers` is the pool (non-empty; `ctx.pool_view()` adds its load order),
`ctx.cached_blocks` the longest cached prefix of the prompt on each worker (workers with none
are absent; it counts the blocks that requests routed there will have computed by the time
this one runs, `ctx.reported_blocks` only those the workers reported; `ctx.restore_s` what
the part of it in an offload tier costs to copy back), `ctx.held_blocks`
how many blocks each worker's cache holds (filled only for a policy that sets
`wants_block_counts`: it costs a pass over the workers). A policy must not
mutate `ctx` or the WorkerStates; the Router owns the accounting. Policies are looked up by
name in a per-pool registry, so `round_robin`, `least_loaded` and `random` work for both pools and
`cache_aware` means the prefill formula or the decode formula depending on the pool. The
built-in ones are configurations of filters, weighted scorers and a picker
(configurations.py, from the pieces of plugin.py).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar

from core.roles import WorkerRole
from router.routing.decision import PrefixPull
from router.routing.pool import Pool
from router.routing.worker_state import WorkerState

_NONE: Mapping[str, int] = MappingProxyType({})
_NO_RESTORE: Mapping[str, float] = MappingProxyType({})

POOLS = (WorkerRole.PREFILL, WorkerRole.DECODE)
"""The pools a policy chooses in (a unified worker sits in the decode pool)."""


class RouteContext(NamedTuple):
    """Everything a policy may look at for one request (a NamedTuple: cheap to build per
    decision, immutable)."""

    workers: Sequence[WorkerState]
    cached_blocks: Mapping[str, int]
    num_prompt_blocks: int
    num_prompt_tokens: int
    block_size: int
    num_output_tokens: int = 0
    pool: Pool | None = None
    """`workers` with their load order, when the caller keeps one (the Router's LoadTracker).
    Policies that need it and find None build one from `workers`."""
    held_blocks: Mapping[str, int] = _NONE
    """Blocks each worker's cache holds, per the index (see the module docstring)."""
    reported_blocks: Mapping[str, int] | None = None
    """`cached_blocks` without the blocks only promised to a worker by routing decisions
    whose prefills have not reported them yet (router/routing/index/pending.py): what a
    peer can send now. None: the same as `cached_blocks`."""
    restore_s: Mapping[str, float] = _NO_RESTORE
    """Seconds each worker needs to copy back the part of its cached prefix that only an
    offload tier holds (router.routing.restore_cost); workers with none are absent."""
    tail_age_s: Mapping[str, float] = _NO_RESTORE
    """Seconds since each worker stored the oldest of the blocks it holds, as its KV events
    tell (router/routing/index/turnover.py; with `held_blocks`); absent where not known."""

    def pool_view(self) -> Pool:
        return self.pool if self.pool is not None else Pool(self.workers)


class Choice(NamedTuple):
    """A policy's pick, why, and the terms of its formula (logged and put in the decision).

    The terms come as two parallel tuples: names (a per-policy constant, so the Router can
    cache their prefixed forms) and values; `terms` zips them."""

    worker: WorkerState
    reason: str
    term_names: tuple[str, ...] = ()
    term_values: tuple[float, ...] = ()
    pull: PrefixPull | None = None
    """Blocks the chosen worker copies from a peer's cache (prefix migration), if any."""
    placed_s: float = 0.0
    """The work the policy counted against the worker for this choice (its balance tally),
    which other router replicas add to theirs (`Policy.placed_elsewhere`)."""

    @property
    def terms(self) -> tuple[tuple[str, float], ...]:
        return tuple(zip(self.term_names, self.term_values))


class Policy(abc.ABC):
    """Chooses one worker of a pool for a request."""

    name: str
    formula: str = ""
    """The cost formula, printed in the Router's debug log line beside the terms."""
    wants_block_counts: ClassVar[bool] = False
    """True: the Router fills `RouteContext.held_blocks` for this policy."""

    def __init__(self, pool: str) -> None:
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose from {POOLS}")
        self.pool = pool

    @abc.abstractmethod
    def choose(self, ctx: RouteContext) -> Choice: ...

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:  # noqa: B027 - optional hook
        """The served model's KV size, known once a worker joined (for costs in time)."""

    def placed_elsewhere(  # noqa: B027 - optional hook
        self, workers: Sequence[WorkerState], worker_id: str, placed_s: float
    ) -> None:
        """Another router replica chose `worker_id` of the pool `workers` and counted
        `placed_s` (its Choice's) against it: a policy that balances what it placed counts
        the pool's decisions, not only its own."""


def pool_load(worker: WorkerState, pool: str) -> tuple[int, int]:
    """The "load" ties and the least-loaded fallback compare, per pool (smaller is lighter)."""
    if pool == WorkerRole.PREFILL:
        return (worker.queued_prefill_tokens, worker.running)
    return (worker.running, -worker.free_blocks)


PolicyFactory = Callable[..., Policy]
"""Builds a policy: `factory(pool, **kwargs)` (a Policy class or a configuration's builder)."""
_F = TypeVar("_F", bound=PolicyFactory)
_REGISTRY: dict[tuple[str, str], PolicyFactory] = {}


def register(name: str, pools: Sequence[str] = POOLS) -> Callable[[_F], _F]:
    """Decorator: make `name` selectable for the given pools, built by the decorated factory."""

    def deco(factory: _F) -> _F:
        for pool in pools:
            _REGISTRY[(pool, name)] = factory
        return factory

    return deco


def make_policy(name: str, pool: str, **kwargs: Any) -> Policy:
    """The policy registered as `name` for `pool`, built with `kwargs`."""
    try:
        factory = _REGISTRY[(pool, name)]
    except KeyError:
        names = sorted(n for p, n in _REGISTRY if p == pool)
        raise ValueError(f"unknown {pool} policy {name!r}; choose from {names}") from None
    return factory(pool, **kwargs)


def policy_names(pool: str) -> list[str]:
    return sorted(n for p, n in _REGISTRY if p == pool)
