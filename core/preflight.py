"""The preflight: whether a prefill worker's KV can become a decode worker's, decided at
start-up from what each worker says it is (`WorkerFacts`), never at the first request.

A block moves from one cache to the other byte for byte (kv_transfer), and the decode worker
goes on from the prompt's KV with its own weights and tokenizer. So a pair can work only
when the two agree on:

    what the KV means    model (id, weights), tokenizer, head geometry, rope, the LoRA
                         adapters it serves (a request's adapter runs on both sides)
    how the KV is laid   block size, KV cache dtype, TP size (rank r sends to rank r)

The first group can never differ. The second could be mapped by the transfer (heads split
or joined across ranks, blocks re-cut, values re-quantized), but the transfer maps none of
it today, so the preflight refuses those too and says the mapping is missing. `preflight`
is the one place this rule lives: the controller calls it when a worker is up, before it
connects the worker to a peer or admits it (router/cluster/controller.py).

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
_UNMAPPED = "the KV transfer copies blocks as they are and cannot yet map "

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
    "block_size": _UNMAPPED + "one block size onto another: blocks are not re-cut",
    "kv_cache_dtype": _UNMAPPED + "one KV cache dtype onto another: nothing re-quantizes",
    "tp_size": _UNMAPPED + "one TP size onto another: rank r sends to rank r only",
}
"""Why each field must match; every field of WorkerFacts has its line (a test checks)."""


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


def preflight(prefill: WorkerFacts, decode: WorkerFacts) -> list[Mismatch]:
    """Every field on which KV from a worker with `prefill`'s facts cannot become KV of a
    worker with `decode`'s; empty when the pair works. Pure: no I/O, no state."""
    return [
        Mismatch(f.name, getattr(prefill, f.name), getattr(decode, f.name), WHY[f.name])
        for f in fields(WorkerFacts)
        if getattr(prefill, f.name) != getattr(decode, f.name)
    ]


def check_joining(
    worker_id: str,
    role: str,
    facts: WorkerFacts | None,
    others: list[tuple[str, str, WorkerFacts | None]],
) -> None:
    """Raise PreflightError when worker `worker_id` (of pool `role`, with `facts`) cannot
    pair with one of `others` ((worker id, pool, facts) of the workers already there, the
    first one first). Every worker is checked against every other, its own pool's included:
    one engine configuration holds throughout a cluster today (the router also hashes every
    worker's blocks with the first worker's block size). A worker without facts (a test
    double) is not checked."""
    for other_id, other_role, other_facts in others:
        if facts is None or other_facts is None:
            continue
        joining_first = role == "prefill" and other_role != "prefill"
        if joining_first:
            found = preflight(facts, other_facts)
            sides = (f"{role} {worker_id}", f"{other_role} {other_id}")
        else:
            found = preflight(other_facts, facts)
            sides = (f"{other_role} {other_id}", f"{role} {worker_id}")
        if found:
            raise PreflightError(worker_id, sides, found)
