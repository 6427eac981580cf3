"""A request's life inside one engine: its tokens, how many have KV ("computed"), its status.

vLLM v1's one idea: there are no prefill or decode phases, only each request's computed
tokens catching up with its tokens. A new prompt has `num_computed_tokens` = its prefix-cache
hit; a chunk of prefill advances it by the chunk; a decode step by one; a request whose prompt
KV arrived over the wire starts with every prompt token computed.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from core.hashing import BlockHash
from core.lora import LoRARef
from core.request import FinishReason, RequestTimings, TokenLogprob
from core.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"
    """Decode role: blocks reserved, prompt KV still in flight from a prefill worker."""
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_step: int = 0
    """Steps its engine had run when it arrived (a prefilled prompt's backlog: see
    prefill_worker.connector.PrefillResult.backlog)."""
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    """Prompt tokens whose KV was reused (prefix cache or transfer); -1 until first scheduled."""
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[BlockHash] = field(default_factory=list)
    """Chained hashes of every full block of `all_token_ids`, extended as tokens arrive."""
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    num_resumed_tokens: int = 0
    """Output tokens another worker generated before the request moved here (they lead
    `output_token_ids`; this engine computes their KV like the prompt's)."""
    timings: RequestTimings = field(default_factory=RequestTimings)
    # Set by the engine: per-request sampling generator, detokenizer and stop checker.
    sample_seed: int | None = None
    """The seed of its position-seeded draws (`generator`): params.seed, or one the engine
    drew for an unseeded sampled request when a draft model speculates (the draft then draws
    with the same noise as the target: engine/spec/draft_model.py); None: the sampler's."""
    generator: Any = None
    detokenizer: Any = None
    stop_checker: Any = None
    grammar: Any = None
    """A structured-output request's matcher (`engine.grammar.matcher.RequestGrammar`)."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """Filled as the prompt is computed (`params.prompt_logprobs`); handed to the first
    output delta, then dropped."""
    num_sent_chars: int = 0
    """How much of the detokenizer's text the outputs have carried so far (text that may
    still turn out to be part of a stop string is held back)."""
    num_pending: int = 0
    """Tokens sampled by a step still on the device (engine/overlap.py): counted in
    `num_tokens`, not yet in `all_token_ids`; the step after reads them there."""
    draft_token_ids: list[int] = field(default_factory=list)
    """This step's speculative guesses (engine/spec): computed after the last token, not
    yet part of `all_token_ids`."""
    spec_stats: Any = None
    """`engine.spec.SpecStats` once the request has speculated."""
    priority: int = 0
    """Lower runs first (vLLM's semantics): it is admitted before, and preempts, requests of
    a higher number (engine/scheduler.py)."""
    tenant: str = ""
    """Whose request it is, for the fair share between tenants (core/fair_share.py)."""
    lora: LoRARef | None = None
    """The adapter it runs under (engine/lora); None: the base model."""
    lora_weights: Any = None
    """That adapter as read when the request arrived (`engine.lora.adapter.LoRAAdapter`):
    held while the request lives, so its step never reads the folder again."""

    @property
    def hash_extra(self) -> bytes:
        """What its blocks' hashes carry besides the tokens (core/hashing.py)."""
        return b"" if self.lora is None else self.lora.hash_extra

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        self.timings.arrival = self.arrival_time

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_sampled_here(self) -> int:
        """Output tokens this engine sampled (or was handed, in decode role)."""
        return len(self.output_token_ids) - self.num_resumed_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids) + self.num_pending

    def take_prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """Once, for the request's first delta (the whole prompt has run by then)."""
        taken, self.prompt_logprobs = self.prompt_logprobs, None
        return taken

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
