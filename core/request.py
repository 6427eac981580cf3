"""Request types shared by the engine, the workers and the front doors: the request a
worker's engine is handed, the delta every engine step emits, and the whole output that
whoever needs it accumulates from the deltas.

    front door --GenerateRequest--> cluster --EngineRequest--> worker engines
    front door <--OutputDelta-----  cluster <--OutputDelta---  (one per step: only what is new)
    RequestOutput = the deltas of one request, accumulated (offline API, non-streaming replies)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.errors import InvalidRequestError
from core.hashing import BlockHash
from core.lora import LoRARef
from core.resume import ResumeState
from core.sampling import SamplingParams
from core.tracing import Carried


class FinishReason(enum.StrEnum):
    STOP = "stop"
    """A stop token, EOS or a stop string."""
    LENGTH = "length"
    """max_tokens, or the model's context."""
    ABORT = "abort"
    """Cancelled by the client or the cluster."""
    ERROR = "error"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, logprob) of the top-n alternatives, best first."""
    rank: int | None = None
    """token_id's rank in its distribution (1: the most likely); set in prompt logprobs."""


@dataclass
class RequestTimings:
    """Wall-clock stamps (time.monotonic seconds) of a request's life in one engine."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def queued_s(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def prefill_s(self) -> float | None:
        if self.first_token is None or self.first_scheduled is None:
            return None
        return self.first_token - self.first_scheduled

    @property
    def decode_s(self) -> float | None:
        if self.finished is None or self.first_token is None:
            return None
        return self.finished - self.first_token

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


def check_prompt(prompt_token_ids: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    """The one check of a prompt: non-empty, room for at least one generated token, ids in
    the vocabulary. Raises InvalidRequestError (a ValueError) naming what is wrong."""
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty")
    if len(prompt_token_ids) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(prompt_token_ids)} tokens; this model's context holds "
            f"{max_model_len} (prompt plus at least one generated token)"
        )
    if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size:
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
        raise InvalidRequestError(
            f"prompt token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
        )


@dataclass(frozen=True)
class EngineRequest:
    """A request as an engine takes it: its prompt checked (`check_prompt`) and, when the
    router saw it first, the chained hashes of the prompt's full blocks, so the engine's
    prefix cache reuses them instead of hashing the prompt again. Engines trust both."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    block_hashes: tuple[BlockHash, ...] = ()
    """Hashes of the leading full blocks of prompt + resumed output (any number, even
    none), from `core.hashing`."""
    block_size: int = 0
    """The block size `block_hashes` were made with (0: the engine's own). An engine whose
    blocks are of another size (a decode pool laid out otherwise: worker/landing.py) hashes
    the prompt itself."""
    resume: ResumeState = field(default_factory=ResumeState)
    """A request moved from another worker: the output the client already has. The engine
    continues after it exactly as if the request had never moved (`core.resume`)."""
    trace: Carried = field(default_factory=Carried)
    """The W3C trace context of the router's attempt span: the worker's spans are its
    children (core/tracing.py); empty when the request is not traced."""
    priority: int = 0
    """Lower runs first: queued ahead of, and preempting, requests of a higher number."""
    tenant: str = ""
    """Whose request it is: the fair share between tenants counts what each was served
    (core/fair_share.py)."""
    lora: LoRARef | None = None
    """The LoRA adapter it runs under (core/lora.py); None: the base model. Its block
    hashes are made with the adapter's `hash_extra`."""


@dataclass(kw_only=True)
class RequestProgress:
    """Where a request stands after its latest step (what both an output delta and the
    accumulated output carry)."""

    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended the request, if any."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from a prefix cache (or over the wire, in decode role)."""
    num_draft_tokens: int = 0
    """Speculative decoding so far: tokens drafted for this request and verified..."""
    num_accepted_tokens: int = 0
    """...and of those, accepted (its acceptance rate is their ratio)."""
    timings: RequestTimings = field(default_factory=RequestTimings)
    error: str | None = None
    prefilled_by: str = ""
    """On the delta with the first token: the pool whose worker computed the prompt when it
    is not the one decoding it (`prefill`); the autoscaler charges that pool the TTFT."""


@dataclass
class OutputDelta(RequestProgress):
    """What one engine step added to one request: only the new tokens, their logprobs and
    the newly visible text (vLLM v1's engine-core outputs). Nothing here grows with the
    length of the output; whoever needs the whole accumulates (`RequestOutput.add`)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str = ""
    new_logprobs: list[TokenLogprob] | None = None
    """None when the request asked for no logprobs."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """On a request's first delta when it asked for them: one per prompt token, the first
    None (nothing precedes it)."""


@dataclass
class RequestOutput(RequestProgress):
    """Everything a request has produced so far: its deltas, accumulated."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def add(self, delta: OutputDelta) -> RequestOutput:
        """Append one delta (in order); returns self."""
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.token_ids.extend(delta.new_token_ids)
        self.text += delta.new_text
        if delta.new_logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.new_logprobs)
        self.finished = delta.finished
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        self.num_cached_tokens = delta.num_cached_tokens
        self.prefilled_by = delta.prefilled_by or self.prefilled_by
        self.num_draft_tokens = delta.num_draft_tokens
        self.num_accepted_tokens = delta.num_accepted_tokens
        self.timings = delta.timings
        self.error = delta.error
        return self
