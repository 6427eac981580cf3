"""Which requests speculate this step, how many tokens, and what the step then accepted.

A speculating request is scheduled for 1 + k tokens: its last sampled token (whose KV a
decode step computes anyway) and k drafts, laid out as 1 + k decode rows (each attends to
the context up to itself). The runner samples at every one of those positions, exactly as
it would have sampled there had the drafts been real tokens (the same penalties, bias and,
for a seeded request, the same position-seeded draw). The rule after the step keeps the
samples up to and including the first that differs from its draft:

    emitted = s_0 .. s_a  where  a = the number of leading i with s_i == d_i

Exact in distribution for any sampling parameters: with a one-hot proposal (a draft is a
single token, not a distribution) rejection sampling accepts d_i with probability p_i(d_i),
and on rejection draws from p_i with d_i taken out, renormalised; a sample s_i ~ p_i that
equals d_i with probability p_i(d_i) and, given it does not, is distributed as p_i without
d_i, is exactly that. And token for token: greedy rows, and seeded rows (whose draw at an
output position depends only on (seed, position)), emit what decoding without drafts emits.
Accepted drafts' KV stays (the step computed it); rejected drafts' slots lie past the
computed tokens and are overwritten later. Blocks are named for the prefix cache only over
real tokens.

Draft length adapts per request: it doubles after a step that accepted every draft (up to
2x `num_tokens`: copying runs long) and drops to one past what was accepted after a step
that rejected one. Back-off: a request whose drafts were all rejected stops proposing for
1, 2, 4 .. 16 steps (reset by an accepted draft), so poor acceptance costs at most a
verification step in 16. Batches of more than `max_batch` requests do not speculate: the
more rows a step has, the less a memory-bound step it is, and drafts then displace real
work (16 is vLLM's kind of cut-off, not a figure measured here).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.spec.ngram import propose_ngram

if TYPE_CHECKING:
    from core.sampling import SamplingParams
    from engine.request import Request
    from engine.spec.draft_model import DraftModel

METHODS = ("ngram", "draft")
MAX_BATCH = 16
"""Running requests above which none speculates (module docstring)."""
MAX_BACKOFF_STEPS = 16
MIN_NGRAM = 2
"""The shortest suffix looked up. One token recurs everywhere, so its drafts are mostly
wrong: with 1 the sampled workload of bench/engine/spec.py accepted 2% of drafts and ran 0.86x
plain decoding; with 2, 13% and 1.07x (the editing workload: 0.74 -> 0.77 accepted)."""


@dataclass
class SpecStats:
    """One request's speculation so far."""

    drafted: int = 0
    accepted: int = 0
    skip: int = 0
    """Steps left before it proposes again (back-off)."""
    backoff: int = 1
    length: int = 0
    """Drafts to propose next; 0 until the first proposal (then the configured number)."""


class Speculator:
    def __init__(
        self,
        method: str,
        num_tokens: int,
        max_model_len: int,
        max_batch: int = MAX_BATCH,
        draft_model: DraftModel | None = None,
        seed: int = 0,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown speculative method {method!r}; choose from {METHODS}")
        if num_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_tokens}")
        if (method == "draft") != (draft_model is not None):
            raise ValueError("the draft method takes a draft model (and only it does)")
        self.num_tokens = num_tokens
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.draft_model = draft_model
        self._seeds = random.Random(seed)

    def sample_seed(self, params: SamplingParams) -> int | None:
        """The seed of a new request's position-seeded draws (`Request.sample_seed`): its
        own; else, for a sampled request a draft model drafts for, one drawn here (the
        draft's draws share the target's noise only through a seed: draft_model.py)."""
        if params.seed is not None or self.draft_model is None or params.is_greedy:
            return params.seed
        return self._seeds.getrandbits(64)

    @staticmethod
    def eligible(req: Request) -> bool:
        # A grammar's mask at draft i depends on the grammar state after drafts < i.
        return req.grammar is None and bool(req.output_token_ids)

    def propose(
        self, reqs: Sequence[Request], budget: int, batch_size: int
    ) -> dict[str, list[int]]:
        """Drafts for the requests about to decode one token this step (request_id -> their
        `draft_token_ids`; absent: none), each within `budget` tokens. A draft model drafts
        for all of them in one batched forward per draft position."""
        if batch_size > self.max_batch:
            return {}
        rooms = [(req, room) for req in reqs if (room := self._room(req, budget)) > 0]
        if self.draft_model is not None:
            return self.draft_model.propose(rooms)
        return {
            req.request_id: propose_ngram(req.all_token_ids, room, min_n=MIN_NGRAM)
            for req, room in rooms
        }

    def _room(self, req: Request, budget: int) -> int:
        """How many drafts `req` may propose now (0: none; counts its back-off down)."""
        if not self.eligible(req):
            return 0
        stats = req.spec_stats
        if stats is None:
            stats = req.spec_stats = SpecStats()
        if stats.skip > 0:
            stats.skip -= 1
            return 0
        return min(
            stats.length or self.num_tokens,
            budget - 1,
            self.max_model_len - req.num_tokens,  # the drafts' positions must exist
            req.params.max_tokens - len(req.output_token_ids) - 1,  # a bonus token follows
        )

    def accept(self, sampled: Sequence[Any], totals: Any = None) -> list[Any]:
        """The tokens to emit from a step's samples (`SampledToken`s in runner order: a
        speculating request's 1 + k in a row); advances each speculating request's computed
        tokens by its accepted drafts and clears its drafts."""
        out: list[Any] = []
        i = 0
        while i < len(sampled):
            req = sampled[i].request
            drafts = req.draft_token_ids
            if not drafts:
                out.append(sampled[i])
                i += 1
                continue
            group = sampled[i : i + len(drafts) + 1]
            i += len(drafts) + 1
            accepted = 0
            while accepted < len(drafts) and group[accepted].token_id == drafts[accepted]:
                accepted += 1
            out.extend(group[: accepted + 1])
            req.num_computed_tokens += accepted
            req.draft_token_ids = []
            self._record(req.spec_stats, len(drafts), accepted, 2 * self.num_tokens)
            if totals is not None:
                totals.draft_tokens += len(drafts)
                totals.accepted_tokens += accepted
        return out

    @staticmethod
    def _record(stats: SpecStats, drafted: int, accepted: int, max_length: int) -> None:
        stats.drafted += drafted
        stats.accepted += accepted
        stats.length = min(2 * drafted, max_length) if accepted == drafted else accepted + 1
        if accepted:
            stats.backoff = 1
        else:
            stats.skip = stats.backoff
            stats.backoff = min(2 * stats.backoff, MAX_BACKOFF_STEPS)


def speculator_for(config: Any, max_model_len: int, runner: Any) -> Speculator | None:
    """The engine's speculator (`EngineConfig.speculative`; a prefill worker's engine, which
    samples only first tokens, runs without). The draft method loads
    `config.speculative_model` on the runner's device, in its dtype, through its attention
    backend."""
    if config.speculative is None:
        return None
    draft = None
    if config.speculative == "draft":
        from engine.spec.draft_model import DraftModel

        draft = DraftModel(
            config.speculative_model,
            runner.model_config,
            runner.device,
            runner.dtype,
            runner.attention_backend,
            max_seqs=MAX_BATCH,
            max_len=max_model_len,
            block_size=config.block_size,
            seed=config.seed,
        )
    return Speculator(
        config.speculative,
        config.num_speculative_tokens,
        max_model_len,
        draft_model=draft,
        seed=config.seed,
    )
