"""The named routing policies, each a configuration of filters, weighted scorers and a picker.

    name          pool     filters                            scorers (weight)        picker
    round_robin   both     -                                  -                       round_robin
    random        both     -                                  -                       random
    least_loaded  both     -                                  load_rank (1)           max_score
    cache_aware   prefill  imbalance_guard, cache_candidates  compute_tokens (w_c),   least_cost
                                                              queued_tokens (w_q)
    cache_aware   decode   has_room                           transfer_share (w_t),   least_cost
                                                              batch_share (w_b),
                                                              kv_used (w_k)
    ttft          prefill  one cost in seconds: its own composition of the same kinds of
                           piece (router.routing.policies.ttft)

`make_policy(name, pool, **kwargs)` (policies.base) builds one; the keyword arguments are the
configuration's (weights, the guard's bounds, a seed) as the CLI and the benchmarks pass them.
The pieces are in filters.py, scorers.py and pickers.py.
"""

from __future__ import annotations

from core.roles import WorkerRole
from router.routing.policies import filters, pickers, scorers  # noqa: F401  (register)
from router.routing.policies.base import Policy, register
from router.routing.policies.pipeline import Configuration, Use
from router.routing.policies.ttft import TtftPrefill

PREFILL, DECODE = WorkerRole.PREFILL, WorkerRole.DECODE


@register("round_robin")
def round_robin(pool: str) -> Policy:
    """Workers in turn, in pool order (a baseline: it ignores the prefix index)."""
    return Configuration("round_robin", Use("round_robin")).build(pool)


@register("random")
def random_choice(pool: str, seed: int = 0) -> Policy:
    """A uniform choice, seeded so runs are reproducible (a baseline)."""
    return Configuration("random", Use("random", {"seed": seed})).build(pool)


@register("least_loaded")
def least_loaded(pool: str) -> Policy:
    """The smallest load (policies.base.pool_load; a baseline)."""
    rank = Use("load_rank", {"pool": pool})
    return Configuration("least_loaded", Use("max_score"), scorers=((1.0, rank),)).build(pool)


def cache_aware_prefill_config(
    compute_weight: float = 1.0,
    queue_weight: float = 1.0,
    balance_abs_tokens: int = 32_768,
    balance_rel: float = 2.0,
    s_per_token: float = 2e-3,
) -> Configuration:
    """Cache-aware prefill:

    1. imbalance guard: an unbalanced pool goes to its lightest worker
    2. cost_w = compute_weight * (T - c_w * B + R_w / t_w)  +  queue_weight * L_w
       the prompt tokens w would still compute (a hit in a slow tier costs its copy back),
       and the prefill work queued before it; only the lightest worker and those caching a
       prefix are scored (any other costs what the lightest does, or more)
    3. the cheapest wins; ties: smaller L_w, then rotation from the lightest
    """
    if compute_weight < 0 or queue_weight < 0 or balance_abs_tokens < 0 or balance_rel < 1:
        raise ValueError("weights and balance_abs_tokens must be >= 0, balance_rel >= 1")
    if s_per_token <= 0:
        raise ValueError("s_per_token must be > 0")
    guard = {"balance_abs_tokens": balance_abs_tokens, "balance_rel": balance_rel}
    return Configuration(
        "cache_aware",
        Use("least_cost", {"tie": "prefill_load", "start": "lightest", "runner_up": True}),
        filters=(Use("imbalance_guard", guard), Use("cache_candidates")),
        scorers=(
            (compute_weight, Use("compute_tokens", {"s_per_token": s_per_token})),
            (queue_weight, Use("queued_tokens")),
        ),
        formula="cost_w = w_c*(T - c_w*B + R_w/t_w) + w_q*L_w",
        no_hit_reason=True,
    )


@register("cache_aware", pools=(PREFILL,))
def cache_aware_prefill(pool: str = PREFILL, **kwargs: float) -> Policy:
    return cache_aware_prefill_config(**kwargs).build(pool)


def cache_aware_decode_config(
    transfer_weight: float = 1.0, batch_weight: float = 1.0, kv_weight: float = 1.0
) -> Configuration:
    """Cache-aware decode:

    1. keep the workers with room for the prompt's blocks they lack and the output's
       (none: the one with the most free blocks)
    2. cost_w = transfer_weight * (P - h_w) / P
              + batch_weight    * running_w / (max running in pool + 1)
              + kv_weight       * (1 - free_w / total_w)
    3. the cheapest wins; ties: fewer running, then rotation
    """
    if min(transfer_weight, batch_weight, kv_weight) < 0:
        raise ValueError("decode policy weights must be >= 0")
    return Configuration(
        "cache_aware",
        Use("least_cost", {"tie": "running", "start": "turn"}),
        filters=(Use("has_room"),),
        scorers=(
            (transfer_weight, Use("transfer_share")),
            (batch_weight, Use("batch_share")),
            (kv_weight, Use("kv_used")),
        ),
    )


@register("cache_aware", pools=(DECODE,))
def cache_aware_decode(pool: str = DECODE, **kwargs: float) -> Policy:
    return cache_aware_decode_config(**kwargs).build(pool)


register("ttft", pools=(PREFILL,))(TtftPrefill)
