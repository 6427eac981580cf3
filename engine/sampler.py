"""The sampler: one token per running request from the model's last-position logits.

Pipeline per row (vLLM / OpenAI semantics):

    raw logits --(slice to vocab_size)--> penalties --> greedy? argmax
                                                    +-> / temperature -> top-k -> top-p -> min-p
                                                        -> softmax -> exponential race
    raw logits --> log_softmax --> logprobs (sampled token + top-n)

Sampling uses the exponential race: token = argmax(p_i / q_i) with q_i = -log(U_i) ~ Exp(1),
which draws exactly from p. A row with its own generator (a seeded request) draws its
`vocab_size` noise values from that generator alone, one row at a time, and the rest of its
pipeline uses exact or row-wise kernels (division, masking, topk, softmax, cumsum); so a seeded
request gets the same tokens alone or at any position of any batch, on the same device and
thread count. (Only a top-k row's softmax runs over a candidate row whose width is the batch's
largest k; padding it with -inf does not change the sums, and the tests check it.) Rows
without a generator share one draw from the sampler's generator.

A seeded request's generator is re-seeded before each draw from (seed, output position)
(`at_position`, `engine.sampling.seeds`): its token at position i does not depend on the
draws before it, so it is the same after the request moved to another worker mid-stream.

A row with top-k (or a top-p nucleus within its best 1024 tokens) is sampled over its
candidates only, so its race costs O(k), not O(vocab): see `engine.sampling.filters`. On CUDA
a kernel finds a top-p-only row's nucleus instead: then only penalties (whose rows need their
tokens on the host anyway, engine/overlap.py) make the sampler wait for the device.

Fast path: when every row is greedy with no penalties and no logprobs the whole step is one
argmax, with no copy of the logits.

A structured-output row (`engine.grammar`) comes with a token mask: its disallowed tokens
get logit -inf in a private copy before anything else, so penalties, temperature, the
filters and the draw (greedy or random) only see what the grammar allows; logprobs are
still the model's own (of the raw logits), as in vLLM. A row's `bias` (logit_bias, and the
stop-token ban before min_tokens: `engine.sampling.bias`) is added to the same copy next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from core.request import TokenLogprob
from core.sampling import SamplingParams
from engine.device import host_to_device
from engine.sampling.bias import TokenBias, apply_bias_
from engine.sampling.filters import filter_logits
from engine.sampling.logprobs import LogprobTensors, host_logprobs, logprob_tensors
from engine.sampling.penalties import apply_penalties, has_penalty
from engine.sampling.seeds import position_seed

if TYPE_CHECKING:
    from engine.grammar.matcher import TokenMask

_SEED_MASK = (1 << 64) - 1


@dataclass
class SamplingRow:
    """One running request, as the model runner hands it to the sampler."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    """Tokens generated so far (used by the penalties)."""
    generator: torch.Generator | None = None
    """Per-request seeded generator (see `make_generator`), already `at_position` for this
    draw; None uses the sampler's own."""
    bias: TokenBias | None = None
    """Added to this row's logits (`engine.sampling.bias.row_bias`); None: nothing."""


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    """None where the row's params.logprobs is None."""


class Sampled:
    """One step's tokens as the sampler left them: `tokens` on the device (what a step
    launched before they reach the host reads, engine/overlap.py), and `result()`, the
    host's copy, with the logprobs. On CUDA their copies to pinned host memory are queued at
    once; `result()` waits for those alone, not for whatever the device was given after."""

    def __init__(
        self,
        tokens: torch.Tensor,
        output: SamplerOutput | None = None,
        logprobs: LogprobTensors | None = None,
    ) -> None:
        """`output`: the result, already on the host (a step that needed it there);
        `logprobs`: the rows' logprobs, on the device."""
        self.tokens = tokens
        self._output = output
        self._logprobs = logprobs
        self._host = [tokens, *(logprobs.tensors() if logprobs is not None else [])]
        self._ready = None
        if output is None and tokens.is_cuda:
            self._host = [_pinned_copy(t) for t in self._host]
            self._ready = torch.cuda.Event()
            self._ready.record()

    def result(self) -> SamplerOutput:
        if self._output is None:
            if self._ready is not None:
                self._ready.synchronize()
            ids, *logprobs = (t.tolist() for t in self._host)
            self._output = SamplerOutput(ids, host_logprobs(self._logprobs, logprobs, ids))
        return self._output


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator for a seeded request (None when the request has no seed), set for its
    first output position.

    The request keeps it for its lifetime; the model runner moves it `at_position` before
    every step that samples for the request. Any Python int is accepted (reduced modulo
    2**64).
    """
    if seed is None:
        return None
    return at_position(torch.Generator(device=device), seed, 0)


def at_position(generator: torch.Generator, seed: int, position: int) -> torch.Generator:
    """Re-seed `generator` for the draw of output position `position` of a request seeded
    with `seed` (a state that depends on nothing else); returns it."""
    generator.manual_seed(position_seed(seed, position))
    return generator


def _is_plain_greedy(params: SamplingParams) -> bool:
    return (
        params.is_greedy
        and params.logprobs is None
        and not has_penalty(
            params.repetition_penalty, params.frequency_penalty, params.presence_penalty
        )
    )


class Sampler:
    """Samples one token per row; not thread-safe (it owns a generator)."""

    def __init__(
        self, vocab_size: int, seed: int | None = None, nucleus_on_device: bool | None = None
    ) -> None:
        """`nucleus_on_device`: a top-p-only row's nucleus comes from a kernel, not from a
        check on the host (engine.sampling.filters; None: on CUDA)."""
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.nucleus_on_device = nucleus_on_device
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        token_mask: TokenMask | None = None,
    ) -> SamplerOutput:
        """Sample from `logits` [len(rows), >= vocab_size]; columns past vocab_size (a padded
        LM head) are ignored. `token_mask` limits its rows to the tokens it allows. Does not
        modify `logits`."""
        return self.sample(logits, rows, token_mask).result()

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        token_mask: TokenMask | None = None,
    ) -> Sampled:
        """`__call__`, with the tokens left on the device where nothing needs them on the
        host yet (plain greedy rows: the common case)."""
        self._check_inputs(logits, rows)
        if not rows:
            empty = torch.empty(0, dtype=torch.int64, device=logits.device)
            return Sampled(empty, SamplerOutput(token_ids=[], logprobs=[]))
        raw = logits = logits[:, : self.vocab_size]
        biased = any(row.bias for row in rows)
        if token_mask is not None or biased:
            logits = logits.to(torch.float32, copy=True)
            if token_mask is not None:
                token_mask.apply_(logits)
            if biased:
                apply_bias_(logits, [row.bias for row in rows])
        if all(_is_plain_greedy(row.params) for row in rows):
            return Sampled(greedy_tokens(logits))
        if raw.dtype != torch.float32:  # a bf16 model's logits: widened (exactly) only here
            widened = raw.float()
            raw, logits = widened, widened if logits is raw else logits
        return self._sample_general(logits, rows, raw, private=logits is not raw)

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
        if not logits.dtype.is_floating_point:
            raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
        if logits.shape[0] != len(rows):
            raise ValueError(
                f"logits has {logits.shape[0]} rows but {len(rows)} sampling rows were given"
            )
        if logits.shape[1] < self.vocab_size:
            raise ValueError(
                f"logits has {logits.shape[1]} columns, fewer than vocab_size={self.vocab_size}"
            )

    def _sample_general(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        raw: torch.Tensor | None = None,
        private: bool = False,
    ) -> Sampled:
        """`logits` is `raw` (None: the same), or (`private`) a masked float32 copy of it
        that may be modified; logprobs come from `raw`."""
        raw = logits if raw is None else raw
        params = [row.params for row in rows]
        device = logits.device
        work, work_is_private = logits, private
        if any(
            has_penalty(p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
            for p in params
        ):
            if not work_is_private:
                work, work_is_private = logits.to(torch.float32, copy=True), True
            apply_penalties(
                work,
                [row.prompt_token_ids for row in rows],
                [row.output_token_ids for row in rows],
                [p.repetition_penalty for p in params],
                [p.frequency_penalty for p in params],
                [p.presence_penalty for p in params],
            )

        token_ids = torch.empty(len(rows), dtype=torch.int64, device=device)
        greedy = [i for i, p in enumerate(params) if p.is_greedy]
        random = [i for i, p in enumerate(params) if not p.is_greedy]
        if greedy:
            index = host_to_device(greedy, torch.long, device)
            token_ids[index] = greedy_tokens(work[index])
        if random:
            index = host_to_device(random, torch.long, device)
            temperature = host_to_device(
                [params[i].temperature for i in random], torch.float32, device
            )
            if len(random) < len(rows):
                scaled = work[index].float().div_(temperature[:, None])
            elif work_is_private and work.dtype == torch.float32:
                scaled = work.div_(temperature[:, None])
            else:  # one pass that also copies: the caller's logits are never modified
                scaled = work.float() / temperature[:, None]
            token_ids[index] = self._sample_random(scaled, [rows[i] for i in random])
        return Sampled(
            token_ids, logprobs=logprob_tensors(raw, token_ids, [p.logprobs for p in params])
        )

    def _sample_random(self, scaled: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Filters and the exponential race over `scaled`: a private float32 copy of the
        non-greedy rows' logits, already divided by temperature, modified in place."""
        params = [row.params for row in rows]
        filtered = filter_logits(
            scaled,
            [p.top_k for p in params],
            [p.top_p for p in params],
            [p.min_p for p in params],
            self.nucleus_on_device,
        )
        token_ids = torch.empty(len(rows), dtype=torch.int64, device=scaled.device)
        if filtered.candidate_rows:
            index = host_to_device(filtered.candidate_rows, torch.long, scaled.device)
            chosen = self._race(
                filtered.candidate_logits,
                [rows[i] for i in filtered.candidate_rows],
                filtered.candidate_widths,
            )
            token_ids[index] = filtered.candidate_token_ids.gather(1, chosen[:, None]).squeeze(1)
        if filtered.full_rows:
            index = host_to_device(filtered.full_rows, torch.long, scaled.device)
            vocab_size = filtered.full_logits.shape[1]
            token_ids[index] = self._race(
                filtered.full_logits,
                [rows[i] for i in filtered.full_rows],
                [vocab_size] * len(filtered.full_rows),
            )
        return token_ids

    def _race(
        self, logits: torch.Tensor, rows: list[SamplingRow], widths: list[int]
    ) -> torch.Tensor:
        """Column index of the exponential race's winner in each row of `logits`.

        Row i draws `widths[i]` noise values (its own generator's, if it has one); columns
        past its width have probability 0. softmax is a row-wise kernel and division is exact,
        so a row's result does not depend on the rest of the batch.
        """
        probs = logits.softmax(dim=-1)
        # argmax(p / q) with q = -log(u) is argmin(p / log(u)): saves a negation pass.
        return probs.div_(self._log_uniform_noise(probs, rows, widths)).argmin(dim=-1)

    def _log_uniform_noise(
        self, probs: torch.Tensor, rows: list[SamplingRow], widths: list[int]
    ) -> torch.Tensor:
        """log(U), U ~ Uniform[0, 1), shaped like `probs` (-log(U) ~ Exp(1); several times
        faster than `exponential_` on CPU).

        A seeded row draws exactly `widths[i]` values from its own generator into its own row
        (uniform_ is a serial kernel: no thread wake-ups inside the per-row loop); the log is
        then one elementwise pass, whose value per element does not depend on its position.
        U = 0 gives log(U) = -inf and a ratio of -0: that token loses the race (p = 2^-24 per
        draw), and there is never a nan.
        """
        device = probs.device
        noise = torch.empty_like(probs)
        seeded = [i for i, row in enumerate(rows) if row.generator is not None]
        if not seeded:
            return noise.uniform_(generator=self._own_generator(device)).log_()
        if min(widths) < probs.shape[1]:
            noise.fill_(0.5)  # past a row's width p = 0, and 0 / log(0.5) loses the race
        unseeded = [i for i, row in enumerate(rows) if row.generator is None]
        if unseeded:
            shared = torch.empty((len(unseeded), probs.shape[1]), device=device)
            shared.uniform_(generator=self._own_generator(device))
            noise[host_to_device(unseeded, torch.long, device)] = shared
        for i in seeded:
            _draw_uniform_row(noise[i, : widths[i]], rows[i].generator)
        return noise.log_()

    def _own_generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(self._seed) & _SEED_MASK)
            self._generators[device] = generator
        return generator


def _draw_uniform_row(out: torch.Tensor, generator: torch.Generator) -> None:
    """Fill one row with U ~ Uniform[0, 1) drawn from `generator` (on any device). A worker
    has one device of a kind: a CUDA generator made for "cuda" names no index, its rows'
    devices do."""
    if generator.device.type == out.device.type:
        out.uniform_(generator=generator)
    elif out.is_cuda:  # a host generator's draw, queued to the device (not waited for)
        drawn = torch.empty(out.shape, pin_memory=True).uniform_(generator=generator)
        out.copy_(drawn, non_blocking=True)
    else:
        out.copy_(torch.empty(out.shape, device=generator.device).uniform_(generator=generator))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token (the first of equal maxima, as argmax).

    `max(dim).indices` rather than `argmax`: same indices (ties and NaN included), but on CPU
    torch's argmax over bfloat16 rows is 2-5x slower (64 x 32,000: 3.4 ms against 0.7, more
    than the LM head's GEMM).
    """
    return logits.max(dim=-1).indices
