"""KV-cache events and load reports: what workers tell the router.

A tiny tagged union, after Dynamo's KV router: `stored(parent, blocks)`, `removed(blocks)`,
`cleared`, plus `tiered(blocks, tier)` for the KV offload tiers below the device cache.
Workers send them in batches stamped with a per-worker sequence number that increases by
one per batch; a router that sees a gap knows its view of that worker is stale
and re-syncs (asks for a snapshot) or purges the worker. msgspec Structs give a compact,
versioned msgpack encoding for Redis streams and Ray messages.
"""

from __future__ import annotations

import msgspec

from core.hashing import BlockHash
from core.step_stats import StepTotals

EVENTS_VERSION = 2
"""2: `BlockTiered` (the offload tiers)."""


class BlockStored(msgspec.Struct, tag="stored", frozen=True, array_like=True):
    """Blocks became cached on the worker, as one chain: `block_hashes[0]`'s parent is
    `parent` (None: the chain starts at the model root), each next block's parent is the
    previous one."""

    parent: BlockHash | None
    block_hashes: list[BlockHash]


DEVICE_TIER = 0
TIER_NAMES = ("device", "host", "disk")
"""Where a worker's block lives: its device cache (tier 0), or an offload tier below it
(engine/kv_cache/offload.py), slower to bring back the lower it is."""


class BlockTiered(msgspec.Struct, tag="tiered", frozen=True, array_like=True):
    """Blocks the worker still holds left its device cache for offload tier `tier` (1 host,
    2 disk; TIER_NAMES): a hit on them costs a copy back, not a recompute. A later
    `BlockStored` of a block puts it back in the device cache."""

    block_hashes: list[BlockHash]
    tier: int


class BlockRemoved(msgspec.Struct, tag="removed", frozen=True, array_like=True):
    """Blocks were evicted from the worker's cache."""

    block_hashes: list[BlockHash]


class AllBlocksCleared(msgspec.Struct, tag="cleared", frozen=True, array_like=True):
    """The worker dropped its whole cache (restart, reset)."""


KVEvent = BlockStored | BlockTiered | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, frozen=True):
    """Events of one worker, in order. `seq` is that worker's batch counter, starting at 0;
    a receiver that has seen seq n and then gets seq > n + 1 has missed events.

    A worker opens its life (start or restart) with a seq-0 batch whose first event is
    `AllBlocksCleared`, so a restart is never mistaken for a duplicate; a re-sync snapshot is
    a batch `[AllBlocksCleared(), BlockStored(None, hashes), BlockTiered(...), ...]`."""

    worker_id: str
    seq: int
    events: list[KVEvent]
    timestamp: float = 0.0
    model: str = ""
    version: int = EVENTS_VERSION


class WorkerLoad(msgspec.Struct, frozen=True):
    """A worker's periodic load report: what the routing policies weigh, and what the
    metrics and the admin view show of the worker."""

    worker_id: str
    role: str
    num_running: int
    num_waiting: int
    num_waiting_tokens: int
    num_free_blocks: int
    num_total_blocks: int
    timestamp: float = 0.0
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    """Prompt tokens seen since the worker started, and those its prefix cache served."""
    steps: StepTotals = msgspec.field(default_factory=StepTotals)
    """Where its engine steps have gone since it started."""
    num_pulled_prompt_tokens: int = 0
    """Prompt tokens whose KV it copied from a peer prefill worker's cache instead of
    computing them (prefix migration), since it started; not in the cached count."""
    oldest_wait_s: float = 0.0
    """How long the oldest request without its first token (queued, or its prompt still
    running) has waited: the autoscaler's early signal, a wait grows before any TTFT shows it."""
    max_num_seqs: int = 0
    """Its engine's cap on running requests (0: not reported, as by older workers)."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters resident in its slots (engine/lora), least recently used first."""
    max_loras: int = 0
    """Its adapter slots (0: it serves the base model only)."""

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV blocks in use, 0..1."""
        total = self.num_total_blocks
        return 1.0 - self.num_free_blocks / total if total else 0.0

    @property
    def batch_usage(self) -> float:
        """Fraction of its running-request slots in use, 0..1 (0 when the cap is unknown)."""
        cap = self.max_num_seqs
        return min(1.0, self.num_running / cap) if cap else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over the worker's life, 0..1."""
        n = self.num_prompt_tokens
        return self.num_cached_prompt_tokens / n if n else 0.0


_event_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_load_decoder = msgspec.msgpack.Decoder(WorkerLoad)


def encode(obj: KVEventBatch | WorkerLoad) -> bytes:
    return _event_encoder.encode(obj)


def decode_event_batch(data: bytes) -> KVEventBatch:
    return _batch_decoder.decode(data)


def decode_worker_load(data: bytes) -> WorkerLoad:
    return _load_decoder.decode(data)
