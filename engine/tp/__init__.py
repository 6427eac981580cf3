"""Tensor parallelism inside a node: one engine over `tp_size` rank processes (SPMD).

driver.py  TPEngine: the LLMEngine surface, each call sent to every rank in lockstep
ranks.py   a rank's life (join the group, build its shard, serve calls) and its handle
"""

from engine.tp.driver import TPEngine, check_tp_size
from engine.tp.ranks import ProcessRank, RankHandle, free_port, init_tp_group, rank_main

__all__ = [
    "ProcessRank",
    "RankHandle",
    "TPEngine",
    "check_tp_size",
    "free_port",
    "init_tp_group",
    "rank_main",
]
