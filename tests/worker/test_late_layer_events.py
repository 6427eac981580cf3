"""Prefill → decode with layers that are written late, as on a GPU: the decode worker gets
exactly the KV the prefill worker computed, never what its cache held before the stream got
there.

Real prefill and decode workers (tiny model, shm transport, this process). The prefill
engine's layer events are replaced by late ones: when the hook fires, the layer's cache
is overwritten with garbage (the kernels are "still queued") and the real values come
back only when the event completes, a few transport looks later. A send posted at the hook
instead of at the event would hand the decode worker the garbage.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from tests.support.worker_pair import (
    TIMEOUT_S,
    cached_kv,
    on_engine,
    request,
    run_here,
    same,
    settled,
)

LOOKS = 3


class LateLayer:
    """The event of one layer of a step whose kernels complete on the transport's
    `LOOKS`-th look (the I/O thread calls `query`)."""

    def __init__(self, kv_layer: torch.Tensor) -> None:
        self.kv_layer = kv_layer
        self.real = kv_layer.clone()
        kv_layer.fill_(7.0)
        self.looks = 0
        self.done = False
        self._lock = threading.Lock()

    def query(self) -> bool:
        with self._lock:
            self.looks += 1
            if not self.done and self.looks >= LOOKS:
                self.kv_layer.copy_(self.real)
                self.done = True
            return self.done


def test_decode_gets_the_kv_written_after_the_event(shm_pair, loop_thread) -> None:
    prefill, decode = shm_pair
    events: list[LateLayer] = []

    def make_late(rank: Any) -> None:
        kv = rank.engine.runner.kv_cache

        def late(layer: int) -> LateLayer:
            events.append(LateLayer(kv[layer]))
            return events[-1]

        rank.engine.runner.layer_event = late

    req = request("r", seed=11, max_tokens=4)

    async def scenario() -> None:
        await run_here(decode, req)  # the reference: req's KV computed on the decode worker
        reference = await on_engine(decode, cached_kv)
        assert await on_engine(decode, lambda r: r.engine.kv.pool.reset_prefix_cache())
        await on_engine(prefill, make_late)
        res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        reply = await prefill.prefill(req, decode.worker_id, res.dst_block_ids, 0, TIMEOUT_S)
        await decode.admit(req.request_id, reply.first_token, None, TIMEOUT_S, "ch")
        stream = decode.outputs("ch")
        await stream.aclose()
        await settled(decode)
        await settled(prefill)
        after = await on_engine(decode, cached_kv)
        assert reference.keys() == after.keys()
        assert same(reference, after, reference), "the decode worker got unwritten KV"

    loop_thread.run(scenario())
    num_layers = len(events)
    assert num_layers > 0 and all(e.done and e.looks >= LOOKS for e in events)
