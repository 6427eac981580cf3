"""One simulated decode worker for `baton plan` (planner/sim/cluster.py): continuous batching on
a measured profile, with the prompts it prefills itself mixed into its steps.

A request joins either with its KV already computed (it came from a prefill worker) or with
prompt tokens left to compute here (conditional disaggregation: the router sends prompts
whose uncached part on this worker is short, router.routing.route step 4). Each step spends
a token budget the way the engine's scheduler does (engine/scheduler.py): one token for every
decoding request first, then the rest of the budget to prompt chunks in arrival order. A
step takes

    step_ms = fixed + decode_row_ms * B + decode_ctx_ms * B * L / 1000        (B rows of L)
            + token_ms * U + attn_ms * sum(u * (c + u / 2)) / 1000            (chunks u on c)
    fixed   = decode_step_ms if the step has rows, else the prefill fit's step_ms

so a step of chunks alone costs what the prefill fit says, one of rows alone what the decode
fit says, and a chunk joining rows adds its tokens' cost, not a second fixed cost. Measured
(the 20M bench model, one thread): 6 rows on 1,088 tokens of context 23.7 ms a step, the same
step with a 128-token chunk on 1,024 cached tokens 95.6 ms, the chunk alone 85; this
formula gives 29.3 and 99.2 from that machine's profile, the prefill fit's fixed cost
charged in the mixed step too 108.4 (the rows alone are cheaper than the fit there: they
share their prefix, and cascade attention reads it once). Every decoding request gets a
token at the end of the step; a prompt whose last chunk ran gets its first token then. This
is where prefill-on-decode shows up in the decode workers' time per output token: every row
of a step waits for its chunks.

Its prefix cache is the blocks of every prompt it has held, LRU, reported to the router as
KV events like any worker's (the router subtracts what it holds from what a transfer sends
and from what it must prefill). A prompt's blocks are named when it joins the batch: for a
transfer, once its KV has landed (engine.engine `_landed`; its reservation reused what was
cached then, but names nothing), for a prompt prefilled here when it is scheduled. Until
then a second request for the same prefix does not find it here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from core.events import KVEventBatch, WorkerLoad
from core.perf import DecodeProfile, WorkerProfile
from planner.sim.host import HostCPU
from planner.sim.prefill import SimWorker, prefix_length


@dataclass
class _Seq:
    index: int
    context: int
    """Tokens whose KV it holds here (received, cached or computed)."""
    prefill_left: int
    """Prompt tokens still to compute here (0: its KV came from a prefill worker)."""
    left: int
    """Output tokens still to come from decode steps (after the first)."""
    last_token_ms: float
    """When its latest token left (its first: when its prefill ended here, or when it joined
    the batch with its KV transferred)."""
    hashes: list[int] = field(default_factory=list)
    """Its prompt's block hashes, named in the prefix cache when it joins the batch."""
    gaps: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """KV it will hold at its end: what admission reserves."""
        return self.context + self.prefill_left + self.left


class DecodeSim:
    """One decode worker: continuous batching on the `profile`'s step time, prompts prefilled
    here chunked into its steps (timed by the `prefill` profile, its `chunk_tokens` a step)."""

    def __init__(
        self,
        profile: DecodeProfile,
        max_seqs: int,
        kv_tokens: int,
        prefill: WorkerProfile,
        worker_id: str = "d",
        block_size: int = 16,
    ) -> None:
        self.profile, self.max_seqs, self.kv_tokens = profile, max_seqs, kv_tokens
        self.prefill = prefill
        self.budget = prefill.chunk_tokens
        self.worker_id = worker_id
        # The prefix cache and its KV events are a prefill worker's (LRU of whole chains);
        # its FIFO server is unused here: the steps below are this worker's time.
        self.prefix = SimWorker(worker_id, max(1, kv_tokens // block_size), prefill)
        self.block_size = block_size
        self.clock = 0.0
        self.running: list[_Seq] = []
        self.waiting: deque[tuple[float, _Seq]] = deque()  # (joins no earlier than, request)
        self.finished: dict[int, list[float]] = {}
        self.first_token_ms: dict[int, float] = {}
        """When each request's first token left here: at the end of its prefill's last step,
        or, for a transfer, at the step boundary where it joined."""
        self.events: list[KVEventBatch] = []
        """Batches not yet taken by the router (`take_events`)."""
        self.busy_ms, self.num_steps, self.num_rows, self.num_prefill_tokens = 0.0, 0, 0, 0
        """Where its time went, as the engine's step totals count it."""
        self.host: HostCPU | None = None
        """The host's CPUs (planner/sim/host.py), when modelled: its steps stretch while
        they are all taken, and its tokens are serving work on them."""
        self.busy_elsewhere: Callable[[float], int] = lambda _at: 0
        """How many other engines on its host are stepping at a moment (the cluster's)."""
        self.stretch_at_first: dict[int, float] = {}
        """Each request's host stretch when its first token left (its serving overhead's)."""

    def stretch(self, at_ms: float) -> float:
        """How much longer than profiled its work takes at `at_ms` (1 with no host model)."""
        if self.host is None:
            return 1.0
        return self.host.stretch(at_ms, 1 + self.busy_elsewhere(at_ms))

    # -- what the router sees ----------------------------------------------------------
    def cached_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of the prompt its prefix cache holds now."""
        return prefix_length(hashes, self.prefix.cache)

    def take_events(self) -> list[KVEventBatch]:
        """The KV event batches since the last call, oldest first."""
        out, self.events = self.events, []
        return out

    def tokens_in_flight(self) -> int:
        return sum(r.tokens for r in self.running) + sum(r.tokens for _, r in self.waiting)

    def load(self, now_ms: float) -> WorkerLoad:
        total = self.kv_tokens // self.block_size
        used = -(-self.tokens_in_flight() // self.block_size)
        return WorkerLoad(
            self.worker_id,
            "decode",
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_waiting_tokens=sum(r.prefill_left for r in self.running)
            + sum(r.prefill_left for _, r in self.waiting),
            num_free_blocks=max(0, total - used),
            num_total_blocks=total,
            timestamp=now_ms / 1000,
        )

    # -- requests ----------------------------------------------------------------------
    def add(
        self, kv_at_ms: float, index: int, prompt: int, left: int,
        hashes: list[int] | None = None,
    ) -> None:  # fmt: skip
        """A request whose KV lands at `kv_at_ms`, `left` output tokens after its first."""
        seq = _Seq(index, prompt, 0, left, kv_at_ms, hashes or [])
        self.waiting.append((kv_at_ms, seq))

    def add_prefill(
        self, now_ms: float, index: int, prompt: int, cached: int, left: int,
        hashes: list[int] | None = None,
    ) -> None:  # fmt: skip
        """A request this worker prefills itself: `cached` of its `prompt` tokens are in its
        prefix cache already; `left` output tokens follow its first."""
        cached = min(cached, prompt - 1)  # the last prompt token is computed for its logits
        seq = _Seq(index, cached, prompt - cached, left, now_ms, hashes or [])
        self.waiting.append((now_ms, seq))

    # -- time --------------------------------------------------------------------------
    def run_until(self, t: float) -> None:
        """Every step that starts before `t`."""
        while True:
            self._admit()
            if not self.running:
                if self.waiting and self.waiting[0][0] < t:
                    self.clock = max(self.clock, self.waiting[0][0])
                    continue
                if t != float("inf"):
                    self.clock = max(self.clock, t)
                return
            if self.clock >= t:
                return
            self._step()

    def _step(self) -> None:
        rows = [r for r in self.running if r.prefill_left == 0]
        budget = self.budget - len(rows)
        chunks: list[tuple[_Seq, int]] = []
        for r in self.running:
            if r.prefill_left and budget > 0:
                take = min(r.prefill_left, budget)
                chunks.append((r, take))
                budget -= take
        took = self.step_ms(rows, chunks) * self.stretch(self.clock)
        self.clock += took
        self.busy_ms += took
        self.num_steps += 1
        self.num_rows += len(rows)
        self.num_prefill_tokens += sum(u for _, u in chunks)
        for r in rows:
            r.gaps.append(self.clock - r.last_token_ms)
            r.last_token_ms, r.context, r.left = self.clock, r.context + 1, r.left - 1
            if r.left <= 0:
                self._finish(r)
        first = 0
        for r, take in chunks:
            r.context, r.prefill_left = r.context + take, r.prefill_left - take
            if r.prefill_left == 0:
                first += 1
                self._first_token(r)
                if r.left <= 0:
                    self._finish(r)
        if self.host is not None:
            self.host.tokens(self.clock, len(rows) + first)

    def _first_token(self, r: _Seq) -> None:
        self.first_token_ms[r.index] = r.last_token_ms = self.clock
        if self.host is not None:
            self.stretch_at_first[r.index] = self.stretch(self.clock)

    def step_ms(self, rows: list[_Seq], chunks: list[tuple[_Seq, int]]) -> float:
        """The module docstring's step time."""
        t = 0.0
        if rows:
            t = self.profile.step(len(rows), sum(r.context for r in rows) / len(rows))
        if chunks:
            p = self.prefill
            new = sum(u for _, u in chunks)
            attention = sum(u * (r.context + u / 2) for r, u in chunks)
            t += p.token_ms * new + p.attn_ms * attention / 1000
            if not rows:
                t += p.step_ms
        return t

    def _finish(self, r: _Seq) -> None:
        self.running.remove(r)
        self.finished[r.index] = r.gaps

    def _admit(self) -> None:
        used = sum(r.tokens for r in self.running)
        while self.waiting and self.waiting[0][0] <= self.clock:
            r = self.waiting[0][1]
            full = len(self.running) >= self.max_seqs or used + r.tokens > self.kv_tokens
            if full and self.running:  # an empty worker takes even what does not fit
                return
            self.waiting.popleft()
            used += r.tokens
            if r.hashes:
                _, _, events, _ = self.prefix.serve(r.hashes)
                if events:
                    self.events.append(self.prefix.batch(events))
            if r.prefill_left == 0:  # its KV came over: it joins between two steps, and
                # the engine thread publishes its first token (the prefill's) then
                # (decode_worker.worker `admit`): that is when the client sees it
                self._first_token(r)
                if self.host is not None:
                    self.host.tokens(self.clock, 1)
                if r.left <= 0:
                    self.finished[r.index] = []
                    continue
            self.running.append(r)
