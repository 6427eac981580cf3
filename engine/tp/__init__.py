"""Tensor parallelism inside a node: one engine over `tp_size` rank processes (SPMD).

driver.py  TPEngine: the LLMEngine surface, each call sent to every rank in lockstep
ranks.py   a rank's life (join the group, build its target, serve calls) and its handle;
           the Ray actor ranks of a worker live in worker/ray_ranks.py (no Ray here)
"""

from engine.tp.driver import TPEngine, check_tp_size
from engine.tp.ranks import (
    ProcessRank,
    RankHandle,
    build_rank,
    free_port,
    init_tp_group,
    rank_main,
    serve_call,
)

__all__ = [
    "ProcessRank",
    "RankHandle",
    "TPEngine",
    "build_rank",
    "check_tp_size",
    "free_port",
    "init_tp_group",
    "rank_main",
    "serve_call",
]
