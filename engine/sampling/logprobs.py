"""Logprobs of sampled tokens and their top-n alternatives.

They come from the log-softmax of the *raw* model logits, before penalties, temperature and
filters: the model's own distribution, which is what OpenAI's API reports and what vLLM returns
by default (`logprobs_mode="raw_logprobs"`). With the processed distribution a filtered-out
alternative would show -inf and a greedy request's logprobs would be meaningless.

Computed in two halves, so that a step's logprobs need not wait for the device: the values on
the device beside the sampled tokens (`logprob_tensors`), then, once they are on the host,
one entry per row (`host_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.request import TokenLogprob
from engine.device import host_to_device


@dataclass
class LogprobTensors:
    """The rows that want logprobs (`wanted`), each row's `num_top`, and on the device: the
    sampled tokens' logprobs [len(wanted)], the best `max_top` of each ([len(wanted), max_top],
    values and ids; None when no row wants any)."""

    wanted: list[int]
    num_top: list[int | None]
    chosen: torch.Tensor
    top_values: torch.Tensor | None
    top_ids: torch.Tensor | None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.chosen, self.top_values, self.top_ids) if t is not None]


def logprob_tensors(
    raw_logits: torch.Tensor, token_ids: torch.Tensor, num_top: Sequence[int | None]
) -> LogprobTensors | None:
    """The device half for `token_ids` ([rows], on the logits' device); None where no row
    wants logprobs (num_top[i] None)."""
    wanted = [i for i, n in enumerate(num_top) if n is not None]
    if not wanted:
        return None
    index = host_to_device(wanted, torch.long, raw_logits.device)
    logprobs = torch.log_softmax(raw_logits[index].float(), dim=-1)
    chosen = logprobs.gather(1, token_ids[index][:, None]).squeeze(1)
    max_top = min(max(num_top[i] or 0 for i in wanted), logprobs.shape[1])
    values = ids = None
    if max_top > 0:
        values, ids = logprobs.topk(max_top, dim=-1)
    return LogprobTensors(wanted, list(num_top), chosen, values, ids)


def host_logprobs(
    tensors: LogprobTensors | None, host: list[list], token_ids: Sequence[int]
) -> list[TokenLogprob | None]:
    """One entry per row (None where not wanted), from `host`: `tensors.tensors()` as lists,
    and the rows' sampled `token_ids`."""
    if tensors is None:
        return [None] * len(token_ids)
    chosen = host[0]
    top_values: list[list[float]] = host[1] if tensors.top_values is not None else []
    top_ids: list[list[int]] = host[2] if tensors.top_ids is not None else []
    result: list[TokenLogprob | None] = [None] * len(tensors.num_top)
    for j, i in enumerate(tensors.wanted):
        n = tensors.num_top[i] or 0
        top = tuple(zip(top_ids[j][:n], top_values[j][:n])) if n else ()
        result[i] = TokenLogprob(token_id=int(token_ids[i]), logprob=chosen[j], top=top)
    return result
