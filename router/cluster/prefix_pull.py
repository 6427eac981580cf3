"""Prefix migration on the request path: before prefill worker P runs a prompt, it copies
the blocks the router's `PrefixPull` names from peer prefill worker Q's cache instead of
computing them (Mooncake's cache balancing; the router decides, router/routing/policies/
ttft.py).

Q "prefills" the prefix, which it caches (plus one token past it, when the prompt has one:
then every block of the prefix is a hit and Q computes that token only), and its KV
connector sends the blocks into P's reservation over the same protocol as prefill ->
decode; P then names them in its prefix cache and the prompt hits them. Best effort: on any
failure P computes them, as it would have without the pull.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from core.request import EngineRequest
from core.sampling import SamplingParams
from router.routing.decision import RoutingDecision

logger = logging.getLogger(__name__)


async def pull_prefix(
    path: Any, request: EngineRequest, prefill: Any, decision: RoutingDecision,
    left: Callable[[], float],
) -> None:  # fmt: skip
    """Copy the prompt's blocks [P's cached prefix, + `pull.num_blocks`) from the peer into
    `prefill` (P). `path`: the RequestPath (membership, transfer stats, metrics); `left`:
    the attempt's remaining time, for every call's deadline."""
    pull = decision.pull_from
    assert pull is not None
    peer = path.membership.workers.get(pull.peer_id)
    if peer is None:
        return
    block = prefill.info.block_size
    num_blocks = min(len(request.block_hashes), decision.prefill_cached_blocks + pull.num_blocks)
    tokens = [*request.prompt_token_ids, *request.resume.output_token_ids]
    prefix = EngineRequest(
        f"{request.request_id}.prefix",
        tokens[: num_blocks * block + 1],
        SamplingParams(max_tokens=1, temperature=0.0),
        request.block_hashes[:num_blocks],
        request.block_size,
    )
    stats = path.transfers
    try:
        res = await asyncio.wait_for(
            prefill.handle.reserve.remote(prefix, left(), peer.worker_id), left()
        )
        skip = res.skip_blocks
        await asyncio.wait_for(
            peer.handle.prefill.remote(
                prefix, prefill.worker_id, res.dst_block_ids, skip, left(), hand_over=True
            ),
            left(),
        )
        await asyncio.wait_for(
            prefill.handle.import_prefix.remote(prefix.request_id, left()), left()
        )
    except asyncio.CancelledError:
        _abort(prefix.request_id, prefill, peer)
        raise
    except Exception as e:
        stats.prefix_pulls_failed += 1
        logger.info("request %s: prefix pull from %s failed (%s: %s); computing it",
                    request.request_id, peer.worker_id, type(e).__name__, e)  # fmt: skip
        _abort(prefix.request_id, prefill, peer)
        return
    pulled = max(0, num_blocks - skip)
    stats.prefix_pulls += 1
    stats.prefix_blocks_pulled += pulled
    if path.metrics is not None:
        path.metrics.record_prefix_pull(pulled * block)


def _abort(prefix_id: str, *workers: Any) -> None:
    """Free the prefix's blocks on both workers (fire and forget: they may be gone)."""
    for m in workers:
        with contextlib.suppress(Exception):
            m.handle.abort.remote(prefix_id)
