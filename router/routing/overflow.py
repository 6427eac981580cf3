"""When a backed-up prefill pool hands a prompt to its decode worker instead.

A prompt long enough to disaggregate goes through the prefill pool, unless that pool's queue
is long: then the decode worker, whose core or GPU prefills too, takes the prompt itself
when it would give the first token sooner:

    P        the prefill worker with the shortest queue (router.routing.pool)
    t        P's seconds per prefill token, from its own step totals
             (router.routing.step_rate)
    L_w      prefill tokens queued on w (router.routing.worker_state.prefill_load)
    U_w      the prompt's tokens w does not cache
    wait_P = t * L_P
    ttft_P = wait_P + t * U_P          ttft_D = t * (L_D + U_D)

    overflow  iff  overflow_s > 0 and wait_P >= overflow_s and ttft_D < ttft_P

D is priced at P's rate: its own step totals mix its decode steps into its prefill time
(a decode worker's seconds per prefill token read as its decode batch's), and both run the
same model. Its decode rows slow its prefill a little; the comparison leaves that out.

`overflow_s` is the wait the pool is allowed before its decode workers help: a burst that
outruns the prefill pool is served by the decode workers' spare time at once, while the
autoscaler (router.cluster.autoscale) starts prefill workers for the same queue, which takes
seconds a worker. Under it the pools stay disaggregated. The price is the decode worker's
running streams: its steps carry the prompt's chunks, so their inter-token latency grows
while it prefills; that is why it is off unless asked for (`--prefill-overflow-s`). An
uncalibrated prefill worker (t = 0: no prompt measured yet) never overflows. The KV
transfer P -> D is left out of ttft_P: layer by layer it overlaps the prefill.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.routing.pool import Pool
from router.routing.worker_state import WorkerState


def overflows(
    overflow_s: float,
    prefill_pool: Pool,
    decode: WorkerState,
    num_tokens: int,
    cached: Mapping[str, int],
    block_size: int,
) -> bool:
    """Whether `decode` prefills the prompt itself because `prefill_pool` is backed up."""
    if overflow_s <= 0 or not prefill_pool.workers:
        return False
    p = prefill_pool[prefill_pool.lightest(0)]
    t = p.step_rate.s_per_token
    queued_p = p.queued_prefill_tokens
    if t <= 0 or t * queued_p < overflow_s:
        return False
    u_p = max(0, num_tokens - cached.get(p.worker_id, 0) * block_size)
    u_d = max(0, num_tokens - cached.get(decode.worker_id, 0) * block_size)
    return decode.queued_prefill_tokens + u_d < queued_p + u_p
