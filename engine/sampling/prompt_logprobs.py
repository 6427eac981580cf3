"""Prompt logprobs: for each prompt token, its logprob given the tokens before it, its rank,
and the top-n alternatives at its position (`SamplingParams.prompt_logprobs`).

A step computes them for the rows of the prompt it ran: row i of a chunk starting at
position `start` predicts the token at `start + i + 1`. Logits are computed a slice of rows at
a time, so a long prompt costs `_ROWS x vocab` floats at once, not `prompt x vocab`. Raw
logits, as for sampled tokens' logprobs (engine.sampling.logprobs says why).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from core.request import TokenLogprob
from engine.request import Request

_ROWS = 256


def add_prompt_logprobs(
    req: Request,
    hidden: torch.Tensor,
    start: int,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """`hidden`: the rows this step computed for `req`'s tokens from position `start`.
    Fills `req.prompt_logprobs` for the prompt tokens they predict."""
    num_prompt = req.num_prompt_tokens
    if req.prompt_logprobs is None:
        req.prompt_logprobs = [None] * num_prompt
    # Rows predicting prompt tokens: the one at position p predicts token p + 1 < num_prompt.
    num_rows = min(hidden.shape[0], num_prompt - 1 - start)
    num_top = req.params.prompt_logprobs or 0
    for first in range(0, max(num_rows, 0), _ROWS):
        rows = hidden[first : min(first + _ROWS, num_rows)]
        logprobs = torch.log_softmax(compute_logits(rows).float(), dim=-1)
        begin = start + first + 1
        targets = torch.tensor(req.prompt_token_ids[begin : begin + rows.shape[0]])
        chosen = logprobs.gather(1, targets.to(logprobs.device)[:, None])
        ranks = (logprobs > chosen).sum(dim=1) + 1
        top_values, top_ids = logprobs.topk(min(num_top, logprobs.shape[1]), dim=-1)
        for j, (token, lp, rank, ids, values) in enumerate(
            zip(targets.tolist(), chosen[:, 0].tolist(), ranks.tolist(), top_ids.tolist(),
                top_values.tolist(), strict=True)
        ):  # fmt: skip
            req.prompt_logprobs[begin + j] = TokenLogprob(token, lp, tuple(zip(ids, values)), rank)
