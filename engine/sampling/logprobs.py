"""Logprobs of sampled tokens and their top-n alternatives.

They come from the log-softmax of the *raw* model logits, before penalties, temperature and
filters: the model's own distribution, which is what OpenAI's API reports and what vLLM returns
by default (`logprobs_mode="raw_logprobs"`). With the processed distribution a filtered-out
alternative would show -inf and a greedy request's logprobs would be meaningless.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.request import TokenLogprob


def compute_logprobs(
    raw_logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int | None]
) -> list[TokenLogprob | None]:
    """One entry per row: None where num_top[i] is None, else the sampled token's logprob and
    the num_top[i] most likely tokens (best first; none when num_top[i] == 0)."""
    wanted = [i for i, n in enumerate(num_top) if n is not None]
    result: list[TokenLogprob | None] = [None] * len(num_top)
    if not wanted:
        return result
    device = raw_logits.device
    index = torch.tensor(wanted, dtype=torch.long, device=device)
    logprobs = torch.log_softmax(raw_logits[index].float(), dim=-1)
    chosen_ids = torch.tensor([token_ids[i] for i in wanted], device=device)
    chosen = logprobs.gather(1, chosen_ids[:, None]).squeeze(1).tolist()
    max_top = min(max(num_top[i] or 0 for i in wanted), logprobs.shape[1])
    top_values: list[list[float]] = [[] for _ in wanted]
    top_ids: list[list[int]] = [[] for _ in wanted]
    if max_top > 0:
        values, ids = logprobs.topk(max_top, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    for j, i in enumerate(wanted):
        n = num_top[i] or 0
        top = tuple(zip(top_ids[j][:n], top_values[j][:n]))
        result[i] = TokenLogprob(token_id=int(token_ids[i]), logprob=chosen[j], top=top)
    return result
