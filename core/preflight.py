"""The preflight: whether a prefill worker's KV can become a decode worker's, decided at
start-up from what each worker says it is (`WorkerFacts`), never at the first request.

The decode worker goes on from the prompt's KV with its own weights and tokenizer, so a pair
can work only when the two agree on what the KV means:

    model (id, weights), tokenizer, head geometry, rope, the LoRA adapters it serves (a
    request's adapter runs on both sides)

How the KV is laid out (block size, KV cache dtype, TP size) may differ between the pools:
a decode worker lands an unlike prefill worker's KV in areas of the prefill's layout and
rewrites it in its own (worker/landing.py: blocks re-cut, heads joined or split across
ranks, values converted or quantized). Within one pool the layout must match: the router
hashes a pool's blocks with one block size, and two prefill workers swap prefixes block for
block, rank to rank. `preflight` is the one place this rule lives: the controller calls it
when a worker is up, before it connects the worker to a peer or admits it
(router/cluster/controller.py).

Torch-free: the router imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class WorkerFacts:
    """What a worker's KV handoff depends on (worker/facts.py gathers it)."""

    model_id: str
    """"<model folder>-<config.json hash>": the id KV events and the transfer's handshake use."""
    weights: str
    """A fingerprint of the weight files (names, sizes, first and last MiB of each)."""
    vocab_size: int
    tokenizer: str
    """A hash of the tokenizer files ("" when the model folder has none)."""
    num_layers: int
    num_kv_heads: int
    """Over the whole model, all TP ranks together."""
    head_dim: int
    rope_theta: float
    rope_scaling: str
    """The model's rope scaling as sorted JSON ("" for plain rope)."""
    block_size: int
    kv_cache_dtype: str
    """The cache's dtype name as allocated ("float32", "int8", ...)."""
    tp_size: int
    max_lora_rank: int = 0
    """The largest LoRA adapter rank its engine serves (0: it serves no adapters). Each
    request names its own adapter, which both workers load and check by its digest
    (core/lora.py): they need only serve the same adapters."""


_MEANING = "the decode worker must go on from the prefill worker's KV with the same "
_POOL = "workers of one pool share one KV layout (the router hashes a pool's blocks alike, "
_POOL += "prefill workers swap prefixes block for block, rank to rank): "

WHY: dict[str, str] = {
    "model_id": _MEANING + "model: its KV is meaningless to another one",
    "weights": _MEANING + "weights: the KV of other weights gives other tokens",
    "vocab_size": _MEANING + "vocabulary: a token id must name the same token on both",
    "tokenizer": _MEANING + "tokenizer: a token id must name the same text on both",
    "num_layers": "a block holds one entry per layer: the layer counts must be equal",
    "num_kv_heads": "a block holds one entry per KV head: the head counts must be equal",
    "head_dim": "each KV head entry holds head_dim values: the head sizes must be equal",
    "rope_theta": "keys are stored rotated by rope: both sides must rotate them alike",
    "rope_scaling": "keys are stored rotated by rope: both sides must scale rope alike",
    "max_lora_rank": _MEANING + "adapters: a request's adapter must run on both workers",
    "block_size": _POOL + "the block sizes must be equal",
    "kv_cache_dtype": _POOL + "the KV cache dtypes must be equal",
    "tp_size": _POOL + "the TP sizes must be equal",
}
"""Why each field must match; every field of WorkerFacts has its line (a test checks)."""

LAYOUT = ("block_size", "kv_cache_dtype", "tp_size")
"""The fields that must match within a pool only: the other pool's KV is landed and
rewritten (worker/landing.py)."""


@dataclass(frozen=True)
class Mismatch:
    """One field on which a prefill worker and a decode worker cannot pair."""

    field: str
    prefill: Any
    decode: Any
    why: str

    def message(self, prefill: str = "prefill", decode: str = "decode") -> str:
        """What an operator reads: the field, both sides' values, why they must match."""
        values = f"{prefill} has {self.prefill!r}, {decode} has {self.decode!r}"
        return f"{self.field} differs: {values} ({self.why})"


class PreflightError(ValueError):
    """A worker refused by the preflight; `mismatches` name the fields."""

    def __init__(self, worker_id: str, sides: tuple[str, str], mismatches: list[Mismatch]) -> None:
        said = "; ".join(m.message(*sides) for m in mismatches)
        super().__init__(f"the preflight refuses worker {worker_id}: {said}")
        self.worker_id = worker_id
        self.mismatches = mismatches


class UnpairableError(ValueError):
    """Two workers that cannot move KV between them for a reason no retry changes (their
    transports share no backend, their handshakes disagree: kv_transfer's
    IncompatiblePeerError is one): the controller refuses the pool, as for a preflight
    mismatch, rather than starting worker after worker that meets the same peer."""


def preflight(prefill: WorkerFacts, decode: WorkerFacts, same_pool: bool = False) -> list[Mismatch]:
    """Every field on which KV from a worker with `prefill`'s facts cannot become KV of a
    worker with `decode`'s (`same_pool`: two workers of one pool, whose layouts must match
    too); empty when the pair works. Pure: no I/O, no state."""
    return [
        Mismatch(f.name, getattr(prefill, f.name), getattr(decode, f.name), WHY[f.name])
        for f in fields(WorkerFacts)
        if getattr(prefill, f.name) != getattr(decode, f.name)
        and (same_pool or f.name not in LAYOUT)
    ]


def check_joining(
    worker_id: str,
    role: str,
    facts: WorkerFacts | None,
    others: list[tuple[str, str, WorkerFacts | None]],
) -> None:
    """Raise PreflightError when worker `worker_id` (of pool `role`, with `facts`) cannot
    pair with one of `others` ((worker id, pool, facts) of the workers already there, the
    first one first). Every worker is checked against every other, its own pool's included.
    A worker without facts (a test double) is not checked."""
    for other_id, other_role, other_facts in others:
        if facts is None or other_facts is None:
            continue
        same_pool = role == other_role
        joining_first = role == "prefill" and other_role != "prefill"
        if joining_first:
            found = preflight(facts, other_facts, same_pool)
            sides = (f"{role} {worker_id}", f"{other_role} {other_id}")
        else:
            found = preflight(other_facts, facts, same_pool)
            sides = (f"{other_role} {other_id}", f"{role} {worker_id}")
        if found:
            raise PreflightError(worker_id, sides, found)
