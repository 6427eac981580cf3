"""What the front doors (HTTP, gRPC) call: one `Backend` interface.

The cluster's request path implements it (router.cluster.request_path: prefill -> KV
transfer -> decode across Ray workers); tests implement it over one in-process engine. The
front doors know nothing else: they tokenize, call `generate`, accumulate the deltas they
need, and map `core.errors` exceptions to statuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from core.lora import LoRARef
from core.request import OutputDelta
from core.sampling import SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    timeout_s: float = 300.0
    """Deadline for the whole request, from now; past it: DeadlineExceededError."""
    priority: int = 0
    """Lower runs first (vLLM's semantics), at the prefill gate and in each engine."""
    tenant: str = ""
    """Whose request it is (router/frontdoor/tenants.py): the fair share counts by it."""
    lora: LoRARef | None = None
    """The LoRA adapter its `model` named (router/frontdoor/adapters.py); None: the base."""


class Backend(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Any
    """engine.tokenizer.Tokenizer (torch-free): encode, decode, encode_chat."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        """Checks the prompt (`core.request.check_prompt`: the one check on its way in),
        then yields what each step adds, the last delta with `finished=True`. Raises
        core.errors.* (InvalidRequestError before any output, OverloadedError,
        DeadlineExceededError, WorkerFailedError). Closing the iterator early cancels the
        request and frees its blocks everywhere."""
        ...

    def is_ready(self) -> bool:
        """True when a request can be served now (both pools have a live worker)."""
        ...
