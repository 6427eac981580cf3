"""Sampling parameters: what a request asks of the sampler and the stop checker.

Validated on construction, so a bad value is a clear `ValueError` at the front door and
never reaches a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.structured import StructuredOutput

_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    min_p: float = 0.0
    seed: int | None = None
    """Per-request seed: the same tokens whether the request runs alone or in any batch."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    """Stop strings; the returned text never contains them (unless include_stop_str_in_output)."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    """EOS and `stop_token_ids` cannot be sampled, and stop strings do not end the request,
    before this many output tokens (vLLM's meaning)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling (OpenAI's `logit_bias`;
    -100 and 100 effectively ban or force a token). A dict is accepted and stored sorted."""
    logprobs: int | None = None
    """Return the sampled token's logprob and the top-n alternatives (n = this value)."""
    prompt_logprobs: int | None = None
    """Return each prompt token's logprob (given the tokens before it) and the top-n
    alternatives at its position (vLLM's field). The prompt is then computed in full, not
    taken from a prefix cache: a cached block has no logits."""
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutput | None = None
    """Constrain the output to a JSON schema, regex, choice or grammar (`core.structured`);
    vLLM's name. EOS is allowed only where the constraint is complete."""
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        # Accept lists from JSON callers but store tuples (hashable, immutable).
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
        self._validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def _validate(self) -> None:
        def bad(name: str, value: object, why: str) -> ValueError:
            return ValueError(f"invalid sampling parameter {name}={value!r}: {why}")

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", self.max_tokens, "must be an integer >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", self.temperature, "must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", self.top_p, "must be in (0, 1]")
        if self.top_k < -1:
            raise bad("top_k", self.top_k, "must be -1, 0 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", self.min_p, "must be in [0, 1]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", self.presence_penalty, "must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", self.frequency_penalty, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", self.repetition_penalty, "must be in (0, 10]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", self.logprobs, "must be in [0, 20]")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise bad("prompt_logprobs", self.prompt_logprobs, "must be in [0, 20]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", self.seed, "must be an integer")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", self.stop, "stop strings must be non-empty strings")
        if len(self.stop) > 16:
            raise bad("stop", self.stop, "at most 16 stop strings")
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutput
        ):
            raise bad("structured_outputs", self.structured_outputs, "must be a StructuredOutput")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", self.min_tokens, "must be an integer in [0, max_tokens]")
        if any(t < 0 or not -100.0 <= b <= 100.0 for t, b in self.logit_bias):
            raise bad("logit_bias", dict(self.logit_bias), "ids >= 0, biases in [-100, 100]")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", self.stop_token_ids, "token ids must be >= 0")
