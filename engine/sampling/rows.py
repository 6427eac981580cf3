"""The sampler's row for one position a request samples: its token after its last one, or
after drafts of speculative decoding (the target verifying them, or the draft model making
them), each drawn as if the drafts before it were the request's output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.sampler import SamplingRow, at_position
from engine.sampling.bias import TokenBias, row_bias

if TYPE_CHECKING:
    from engine.request import Request


def _positioned(req: Request, ahead: int = 0) -> torch.Generator | None:
    """A seeded request's generator, set for the output position it samples now (`ahead`
    drafts later: a generator of its own, since one step draws at several positions; past
    its pending tokens, engine/overlap.py)."""
    if req.generator is None or req.sample_seed is None:
        return req.generator
    generator = req.generator if ahead == 0 else torch.Generator(device=req.generator.device)
    position = len(req.output_token_ids) + req.num_pending + ahead
    return at_position(generator, req.sample_seed, position)


def _bias(req: Request, ahead: int = 0) -> TokenBias | None:
    """The request's logit_bias, plus its stop tokens banned before min_tokens. A grammar
    row is not banned: where its grammar is complete only a stop token may follow, so the
    grammar decides (min_tokens does not hold under a constraint)."""
    banned: frozenset[int] = frozenset()
    if req.stop_checker is not None and req.grammar is None:
        position = len(req.output_token_ids) + req.num_pending + ahead
        banned = req.stop_checker.banned_token_ids(position)
    return row_bias(req.params.logit_bias, banned)


def sampling_row(req: Request, drafts: Sequence[int] = ()) -> SamplingRow:
    """The sampler's row for `req`'s token after `drafts` (speculative tokens past its last
    one: engine/spec): sampled as if those drafts were its output, at the output position
    they lead to (a seeded draw's noise depends on nothing else)."""
    ahead = len(drafts)
    output = [*req.output_token_ids, *drafts] if ahead else req.output_token_ids
    return SamplingRow(
        req.params, req.prompt_token_ids, output, _positioned(req, ahead), _bias(req, ahead)
    )
