"""The Router: one synchronous object the request path calls.

Request path of `route` (all in memory; Redis I/O, if any, runs in the store's threads):

    1. hash the prompt's full blocks with core.hashing (or take the caller's hashes)
    2. read the longest cached prefix per worker from the index (skipped when degraded), and
       what copying back the part an offload tier holds costs each (restore_cost.py)
    3. decode pool: the decode policy picks D
    4. conditional disaggregation: D prefills the prompt itself when
         - the prefill pool is empty, or
         - the prompt's part D does not hold is shorter than `disagg_min_uncached_tokens`, or
         - the prefill pool is backed up and D would give the first token sooner
           (`prefill_overflow_s`, overflow.py)
       otherwise the prefill policy picks P among the prefill workers (a unified worker is
       only ever a decode worker that prefills its own requests)
    5. charge the request to the ledger (router.routing.load) and return its Ticket, which
       the caller moves along (admitted, prefill done) and closes, exactly once; with
       replicas, each stage reaches the others' ledgers (load_share.py)
    6. promise the prompt's blocks past the prefilling worker's prefix to that worker
       (index/pending.py), so that the same prefix routed before its KV events arrive, here
       or in another replica, counts them as that worker's

Thread-safe: one lock for load state and policies, the store's lock for the index.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec

from core.events import KVEventBatch, WorkerLoad
from core.hashing import BlockHash, hash_prompt_blocks
from core.roles import WorkerRole
from router.routing.accuracy import AccuracyConfig, PredictionCheck, Reuse, judge
from router.routing.adapters import adapter_pool
from router.routing.decision import Lookup, RoutingDecision
from router.routing.index.pending import DEFAULT_GRACE_S, DEFAULT_TTL_S
from router.routing.index.store import IndexStore, InProcessStore, Prefixes, ResyncCallback
from router.routing.load import LoadTracker
from router.routing.load_share import LoadShare
from router.routing.models import Models, decode_prefixes
from router.routing.overflow import overflows
from router.routing.policies import Choice, RouteContext, make_policy
from router.routing.restore_cost import DEFAULT_TIER_GBPS, RestoreCost
from router.routing.ticket import Ticket

logger = logging.getLogger(__name__)

_NO_HITS: Mapping[str, int] = MappingProxyType({})
"""`cached` (and `held`) of a degraded decision: no worker holds anything as far as we know."""
_NO_RESTORE: Mapping[str, float] = MappingProxyType({})
_DEGRADED = Prefixes(_NO_HITS, _NO_HITS)
_NO_VIEWS = (_NO_HITS, _NO_RESTORE)
"""`IndexStore.cache_views` where none was asked for: no block counts, no tail ages."""


class NoWorkerError(RuntimeError):
    """No worker can serve the request (empty decode pool for the model)."""


@dataclass(frozen=True)
class RouterConfig:
    prefill_policy: str = "cache_aware"
    decode_policy: str = "cache_aware"
    prefill_policy_args: Mapping[str, Any] = field(default_factory=dict)
    decode_policy_args: Mapping[str, Any] = field(default_factory=dict)
    disagg_min_uncached_tokens: int = 256
    prefill_overflow_s: float = 0.0
    """Decode workers help a prefill pool whose shortest queue is this long (s; overflow.py)."""
    default_block_size: int = 16
    pending_ttl_s: float = DEFAULT_TTL_S
    """How long a routed prefill's blocks count as its worker's while it waits and runs,
    before its KV events report them (0: only reported blocks count)."""
    pending_grace_s: float = DEFAULT_GRACE_S
    """... and once the prefill is done, for its events to arrive."""
    late_binding: bool = False
    """Route a request when a prefill worker has room for it, not when it arrives (the
    front door's prefill gate, router.cluster.prefill_gate.PrefillGate.bind)."""
    gate_max_skips: int = 16
    """Times a request at a prefill worker's gate may be passed over by one whose prefix the
    worker caches longer (router.cluster.prefill_gate.next_in_line; 0: first in, first out)."""
    tier_gbps: tuple[float, ...] = DEFAULT_TIER_GBPS
    """Copy-back bandwidth of the host and disk offload tiers (GB/s) a worker is assumed
    to have until it has measured its own (router.routing.restore_cost)."""
    accuracy: AccuracyConfig = field(default_factory=AccuracyConfig)
    """When a worker whose reuse falls short of its own events is resynced
    (router.routing.accuracy)."""


class Router:
    def __init__(
        self,
        config: RouterConfig | None = None,
        store: IndexStore | None = None,
        on_resync: ResyncCallback | None = None,
    ) -> None:
        self.config = config or RouterConfig()
        self.store = store if store is not None else InProcessStore()
        if on_resync is not None:
            self.store.set_resync_callback(on_resync)
        self._prefill = make_policy(
            self.config.prefill_policy, WorkerRole.PREFILL, **self.config.prefill_policy_args
        )
        self._decode = make_policy(
            self.config.decode_policy, WorkerRole.DECODE, **self.config.decode_policy_args
        )
        self._loads = LoadTracker(remote_ttl_s=self.config.pending_ttl_s or DEFAULT_TTL_S)
        if self.store.shares_load:  # replicas: each tells the others what it routed
            self._loads.share = self.store.share_load
            self.store.set_load_share_callback(self._remote_loads)
        self._restore = RestoreCost(self.config.tier_gbps)
        self.models = Models(self.config.default_block_size)
        """What prompts are hashed by, per model (a decode pool's own block size too)."""
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._term_names: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}
        self._accuracy = PredictionCheck(self.config.accuracy)
        self.on_reuse: Callable[[Reuse, bool], None] | None = None
        """Hears each judged prediction and whether it resynced the worker (metrics)."""

    # ---- membership ----------------------------------------------------------------------

    def register_model(self, model: str, block_size: int | None = None, extra: bytes = b"") -> None:
        spec = self.models.register(model, block_size, extra)
        self._loads.hash_block_size[model] = spec.block_size

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:
        """KV bytes one token takes across all layers (a policy may price transfers)."""
        self._prefill.set_kv_bytes_per_token(num_bytes)
        self._decode.set_kv_bytes_per_token(num_bytes)
        self._restore.set_kv_bytes_per_token(num_bytes)

    def add_worker(self, worker_id: str, role: str, model: str = "", block_size: int = 0) -> None:
        """Register a worker (`block_size`: its own); the store asks it for a snapshot."""
        if model not in self.models:
            self.register_model(model)
        with self._lock:
            self._loads.add_worker(worker_id, role, model).block_size = block_size
        self.store.add_worker(model, worker_id)

    def remove_worker(self, worker_id: str) -> None:
        """The worker left: its load state and index entries go (in every replica)."""
        with self._lock:
            state = self._loads.remove_worker(worker_id)
            self._accuracy.forget(worker_id)
        if state is not None:
            self.store.remove_worker(state.model, worker_id)

    # ---- inputs --------------------------------------------------------------------------

    def apply(self, batch: KVEventBatch) -> None:
        """Feed a worker's KV events (an empty `model` means the worker's registered model)."""
        if not batch.model:
            state = self._loads.workers.get(batch.worker_id)
            if state is not None and state.model:
                batch = msgspec.structs.replace(batch, model=state.model)
        self.store.publish(batch)

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Seconds for the promises' lifetimes and the replicas' shared charges, compared
        with the workers' report timestamps (a simulator's clock; default: the system's)."""
        self.store.clock = self._loads.clock = clock

    def _remote_loads(self, shares: list[tuple[bytes, LoadShare]], forget: bool) -> None:
        loads = self._loads
        with self._lock:
            if forget:
                loads.forget_remote()
            for replica, share in shares:
                loads.remote(replica, share)
                w = loads.workers.get(share.worker)
                if share.placed_s and w is not None and w.role is WorkerRole.PREFILL:
                    pool = loads.pool(w.model, WorkerRole.PREFILL).workers
                    self._prefill.placed_elsewhere(pool, w.worker_id, share.placed_s)

    def report_load(self, load: WorkerLoad) -> None:
        with self._lock:
            if not self._loads.report(load):
                logger.debug("load report from unknown worker %s ignored", load.worker_id)

    def hash_blocks(
        self, model: str, tokens: Sequence[int], known: Sequence[BlockHash] = (),
        extra: bytes = b"", decode: bool = False,
    ) -> list[BlockHash]:  # fmt: skip
        """The chained hashes of every full block of `tokens` (core.hashing), for a registered
        model; `known` are the hashes of its leading blocks, not recomputed. `extra`: what
        else the KV depends on (a LoRA adapter's `hash_extra`). `decode`: by the decode
        pool's block size, where it differs (none where it does not)."""
        spec = self.models.get(model)
        if spec is None:
            raise NoWorkerError(f"model {model!r} has no workers")
        return self.models.hash(spec, tokens, known, extra, decode)

    # ---- decision ------------------------------------------------------------------------

    def route(
        self,
        model: str,
        token_ids: Sequence[int] | None = None,
        *,
        block_hashes: Sequence[int] | None = None,
        num_prompt_tokens: int | None = None,
        num_output_tokens: int = 0,
        request_id: str | None = None,
        adapter: str | None = None,
        decode_block_hashes: Sequence[int] = (),
    ) -> Ticket:
        """Decide where a request goes and charge it to the ledger; the caller owns the
        returned ticket and must close it (see router.routing.ticket). `adapter`: its LoRA
        adapter's name (router.routing.adapters narrows the pools to its holders);
        `decode_block_hashes`: `hash_blocks(decode=True)` of the prompt, with `block_hashes`."""
        spec = self.models.get(model)
        if spec is None:
            raise NoWorkerError(f"model {model!r} has no workers")
        # 1. the prompt's chain
        if (token_ids is None) == (block_hashes is None):
            raise ValueError("pass exactly one of token_ids and block_hashes")
        if token_ids is not None:
            hashes: Sequence[int] = hash_prompt_blocks(
                token_ids, spec.block_size, spec.root, spec.extra
            )
            tokens = len(token_ids)
        else:
            hashes = block_hashes  # type: ignore[assignment]
            tokens = num_prompt_tokens if num_prompt_tokens is not None else 0
            tokens = max(tokens, len(hashes) * spec.block_size)
        # 2. cached prefix per worker (None: degraded store, route by load alone)
        prefixes = self.store.longest_prefixes(model, hashes)
        if spec.decode_block_size and prefixes is not None:  # the decode pool's own blocks
            if token_ids is not None:
                decode_block_hashes = self.models.hash(spec, token_ids, decode=True)
            prefixes = decode_prefixes(self.store, model, spec, prefixes, decode_block_hashes)
        degraded = prefixes is None
        views = None
        if self._prefill.wants_block_counts and not degraded:
            views = self.store.cache_views(model)
        held, ages = views or _NO_VIEWS
        lookup = Lookup(
            model, spec.block_size, len(hashes), tokens, num_output_tokens, request_id,
            prefixes if prefixes is not None else _DEGRADED, degraded, held, ages, adapter,
        )  # fmt: skip
        with self._lock:
            ticket = self._decide(lookup)
        # 6. what the prefilling worker will store
        decision, cfg = ticket.decision, self.config
        have = decision.cached_blocks
        if not degraded and have < len(hashes) and cfg.pending_ttl_s > 0:
            worker = decision.prefill_worker_id or decision.decode_worker_id
            promised = hashes[have:]
            store = self.store
            store.promise(model, worker, promised, cfg.pending_ttl_s)
            ticket.on_prefill_end(
                lambda done: store.promise(
                    model, worker, promised, cfg.pending_grace_s if done else 0.0, renew=True
                )
            )
        return ticket

    def _decide(self, lookup: Lookup) -> Ticket:
        cfg = self.config
        model, block = lookup.model, lookup.block_size
        num_blocks, tokens = lookup.num_blocks, lookup.num_tokens
        num_output_tokens, degraded = lookup.num_output_tokens, lookup.degraded
        reported, cached, offloaded = lookup.prefixes
        loads = self._loads
        # 3. decode worker
        decode_pool = adapter_pool(loads.pool(model, WorkerRole.DECODE), lookup.adapter)
        if not decode_pool.workers:
            raise NoWorkerError(f"model {model!r} has no decode (or unified) worker")
        d_choice = self._decode.choose(RouteContext(
            decode_pool.workers, cached, num_blocks, tokens, block, num_output_tokens, decode_pool
        ))  # fmt: skip
        d = d_choice.worker
        d_cached = cached.get(d.worker_id, 0)
        # 4. conditional disaggregation
        prefill_pool = adapter_pool(loads.pool(model, WorkerRole.PREFILL), lookup.adapter)
        d_uncached = max(0, tokens - d_cached * block)
        p_choice = None
        if not prefill_pool.workers:
            reason = "no_prefill_pool"
        elif d_uncached < cfg.disagg_min_uncached_tokens:
            reason = "short_uncached_prefill_on_decode"
        elif overflows(cfg.prefill_overflow_s, prefill_pool, d, tokens, cached, block):
            reason = "prefill_backed_up_prefill_on_decode"
        else:
            restore = _NO_RESTORE
            if offloaded:
                restore = self._restore.for_pool(prefill_pool.workers, offloaded, block)
            p_choice = self._prefill.choose(RouteContext(
                prefill_pool.workers, cached, num_blocks, tokens, block, num_output_tokens,
                prefill_pool, lookup.held_blocks, reported, restore, lookup.tail_age_s,
            ))  # fmt: skip
            reason = p_choice.reason
        p = p_choice.worker if p_choice is not None else None
        p_cached = cached.get(p.worker_id, 0) if p is not None else 0
        pull = p_choice.pull if p_choice is not None else None
        # 5. accounting (blocks pulled from a peer are not computed: not charged either)
        rid = lookup.request_id
        if rid is None:
            rid = f"route-{next(self._ids)}"
        p_reused = p_cached + (pull.num_blocks if pull is not None else 0)
        prefill_tokens = max(0, tokens - p_reused * block) if p is not None else d_uncached
        decode_blocks = num_blocks - min(d_cached, num_blocks) + -(-num_output_tokens // block)
        placed = p_choice.placed_s if p_choice is not None else 0.0
        charge = loads.start(p, prefill_tokens, d, decode_blocks, placed, lookup.adapter)
        terms = self._terms(p_choice, d_choice)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "route %s model=%s blocks=%d prefill=%s (%s; %s) decode=%s (%s) terms=%s "
                "degraded=%s", rid, model, num_blocks, p.worker_id if p else None, reason,
                self._prefill.formula, d.worker_id, d_choice.reason, dict(terms), degraded,
            )  # fmt: skip
        candidates = tuple(w.worker_id for w in (*prefill_pool.workers, *decode_pool.workers))
        decision = RoutingDecision(
            rid, model, p.worker_id if p is not None else None, d.worker_id, num_blocks, tokens,
            p_cached, d_cached, reason, terms, degraded, pull,
            reported.get(p.worker_id, 0) if p is not None else 0, reported.get(d.worker_id, 0),
            candidates, cached,
        )  # fmt: skip
        return Ticket(decision, charge, loads, self._lock)

    def _terms(self, p_choice: Choice | None, d_choice: Choice) -> tuple[tuple[str, float], ...]:
        """The decision's terms: the policies' names, prefixed by pool (cached per name set,
        since policies use constant names), zipped with their values."""
        p_names = p_choice.term_names if p_choice is not None else ()
        key = (p_names, d_choice.term_names)
        names = self._term_names.get(key)
        if names is None:
            if len(self._term_names) >= 256:  # only a policy with ad-hoc names gets here
                self._term_names.clear()
            names = self._term_names[key] = tuple(
                ["prefill_" + k for k in p_names] + ["decode_" + k for k in d_choice.term_names]
            )
        if p_choice is None:
            return tuple(zip(names, d_choice.term_values))
        return tuple(zip(names, p_choice.term_values + d_choice.term_values))

    # ---- how right it was ----------------------------------------------------------------

    def observe_reuse(self, decision: RoutingDecision, worker_id: str, reused_tokens: int) -> None:
        """A worker the decision chose reused `reused_tokens` of the prompt: the prediction
        is judged (`on_reuse` hears it), and the worker's index entry resynced when its
        reuse keeps falling short of its own events (router.routing.accuracy)."""
        spec = self.models.get(decision.model)
        if spec is None:  # every worker of the model left meanwhile
            return
        r = judge(decision, worker_id, reused_tokens, spec.block_size)
        with self._lock:  # a worker that left meanwhile is not judged (nor remembered)
            known = worker_id in self._loads.workers
            resync = known and not decision.index_degraded and self._accuracy.observe(r)
        if resync:
            self.store.request_resync(decision.model, worker_id)
        if self.on_reuse is not None:
            self.on_reuse(r, resync)

    # ---- introspection / lifecycle -------------------------------------------------------

    def admitted_tokens(self, worker_id: str) -> int:
        """Prefill tokens admitted to the worker and not finished (the prefill gate's cap
        applies to this)."""
        with self._lock:
            w = self._loads.workers.get(worker_id)
            return 0 if w is None else w.admitted_prefill_tokens

    def prefill_in_flight(self, model: str) -> dict[str, int]:
        """Each prefill worker of the model -> prompt tokens routed to it and not prefilled
        yet, admitted or still at the prefill gate (late binding's measure of room)."""
        with self._lock:
            return {
                w.worker_id: w.admitted_prefill_tokens + w.gated_prefill_tokens
                for w in self._loads.pool(model, WorkerRole.PREFILL)
            }

    def worker_load(self, worker_id: str) -> tuple[int, int, int] | None:
        """(queued prefill tokens, running, free blocks) as the policies see them."""
        with self._lock:
            w = self._loads.workers.get(worker_id)
            return None if w is None else (w.queued_prefill_tokens, w.running, w.free_blocks)

    @property
    def num_in_flight(self) -> int:
        return self._loads.num_in_flight

    def close(self) -> None:
        self.store.close()
