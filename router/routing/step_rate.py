"""A prefill worker's speed and cache reuse, calibrated online from its own load reports.

Each `WorkerLoad` carries the worker's engine step totals since it started
(core.step_stats.StepTotals) and its lifetime prompt / cached / pulled prompt token counts.
Two reports give exact rates over the interval between them:

    s_per_token = Δ(schedule + forward + sample + output seconds) / Δprefill_tokens
    s_per_pair  = Δattention seconds / Δprefill_pairs          (where attention is timed)
    s_per_token_linear = (Δbusy seconds - Δattention seconds) / Δprefill_tokens
    reuse_rate  = Δ(cached + pulled prompt tokens) / Δprompt_tokens
    utilization = Δbusy seconds / Δreport timestamp        (0..1: the share of time it stepped)
    restore_s_per_block[t] = Δrestore seconds / Δblocks restored, from offload tier t

Both are smoothed (EWMA, weight `alpha` per report that saw enough work) so one odd interval
does not swing routing. An interval with fewer than `min_tokens` new prefill tokens says
little about the speed (step overheads dominate) and is skipped. A restarted worker's totals
go backwards: the new report becomes the baseline and the old estimate stays.

`s_per_token` is 0 until the first usable interval: the policy then uses its prior (and so
is a tier's restore time until the worker restored from it). `s_per_pair` stays 0 where the
engine does not time attention (GPUs: StepTotals.attention_s); a prefill's time is then
linear in its tokens, at `s_per_token`. Where it is timed, a prefill of U tokens after C
costs s_per_token_linear * U + s_per_pair * U * (C + U / 2) (the performance model, core.perf,
with these rates as its coefficients): long prompts' attention grows with their context,
which one rate per token averages away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.events import WorkerLoad


@dataclass(slots=True)
class StepRate:
    alpha: float = 0.3
    min_tokens: int = 256
    s_per_token: float = 0.0
    """Seconds of engine time per prefill token (0: not calibrated yet)."""
    reuse_rate: float = 0.0
    """Recent share of its prompt tokens it did not compute: its prefix cache served them, or
    it pulled them from a peer's. How much of what it caches its workload goes on to reuse
    (a worker fed by pulls has few hits of its own, yet evicting its blocks still costs)."""
    s_per_pair: float = 0.0
    """Seconds of prefill attention per query-key pair (0: attention not timed)."""
    s_per_token_linear: float = 0.0
    """Seconds per prefill token besides attention (set with s_per_pair)."""
    utilization: float = 0.0
    """Recent share of wall time the worker spent stepping."""
    restore_s_per_block: list[float] = field(default_factory=list)
    """Per offload tier (host, disk): seconds to copy one block back (0: not measured)."""
    busy_s: float = 0.0
    """Engine seconds the worker had stepped at its last report (its lifetime total: a
    restart starts it again from 0). What the bounded-load rule counts as work done."""
    _busy_s: float = -1.0
    _util_busy_s: float = 0.0
    _at: float = 0.0
    _tokens: int = 0
    _attention_s: float = 0.0
    _pairs: int = 0
    _prompt: int = 0
    _cached: int = 0
    _restored: list[tuple[int, float]] = field(default_factory=list)

    def update(self, load: WorkerLoad) -> None:
        self._update_restores(load.steps.tier_restored_blocks, load.steps.tier_restore_s)
        steps = load.steps
        busy, tokens = steps.busy_s(), steps.prefill_tokens
        self.busy_s = busy
        attention, pairs = steps.attention_s, steps.prefill_pairs
        prompt = load.num_prompt_tokens
        cached = load.num_cached_prompt_tokens + load.num_pulled_prompt_tokens
        if self._busy_s < 0 or tokens < self._tokens or prompt < self._prompt:
            self._baseline(busy, tokens, prompt, cached)  # first report, or a restart
            self._attention_s, self._pairs = attention, pairs
            self._util_busy_s, self._at = busy, load.timestamp
            return
        if load.timestamp > self._at:
            # A step's seconds reach the report that follows it, so a step longer than the
            # reports' interval lands in one window whole: count at most the window's length
            # and carry the rest into the next ones, where the worker was still busy with it
            # (clipped, the windows between its reports read idle and a saturated worker
            # read mostly idle). Not bounded by a fixed time: the simulator's prefill steps
            # on full-length Mooncake prompts run ~100 s (a 30 s bound cut them short).
            span = load.timestamp - self._at
            credit = min(span, max(0.0, busy - self._util_busy_s))
            self.utilization += self.alpha * (credit / span - self.utilization)
            self._util_busy_s += credit
            self._at = load.timestamp
        d_tokens = tokens - self._tokens
        if d_tokens >= self.min_tokens:
            d_busy = busy - self._busy_s
            self.s_per_token = self._smooth(self.s_per_token, d_busy / d_tokens)
            d_attention, d_pairs = attention - self._attention_s, pairs - self._pairs
            if d_attention > 0 and d_pairs > 0:
                self.s_per_pair = self._smooth(self.s_per_pair, d_attention / d_pairs)
                linear = max(0.0, d_busy - d_attention) / d_tokens
                self.s_per_token_linear = self._smooth(self.s_per_token_linear, linear)
            self._busy_s, self._tokens = busy, tokens
            self._attention_s, self._pairs = attention, pairs
        d_prompt = prompt - self._prompt
        if d_prompt >= self.min_tokens:
            self.reuse_rate = self._smooth(self.reuse_rate, (cached - self._cached) / d_prompt)
            self._prompt, self._cached = prompt, cached

    def _update_restores(self, blocks: list[int], seconds: list[float]) -> None:
        rates = self.restore_s_per_block
        while len(rates) < len(blocks):
            rates.append(0.0)
        base = self._restored
        if len(base) != len(blocks) or any(n < b[0] for n, b in zip(blocks, base)):
            self._restored = list(zip(blocks, seconds))  # first report, or a restart
            return
        for t, (n, s) in enumerate(zip(blocks, seconds)):
            if n > base[t][0]:
                rates[t] = self._smooth(rates[t], (s - base[t][1]) / (n - base[t][0]))
                base[t] = (n, s)

    def _smooth(self, old: float, new: float) -> float:
        return new if old <= 0 else old + self.alpha * (new - old)

    def _baseline(self, busy: float, tokens: int, prompt: int, cached: int) -> None:
        self._busy_s, self._tokens, self._prompt, self._cached = busy, tokens, prompt, cached
