"""Torch-free code shared by every Baton component: the block hash, KV-cache events, the KV
cache layout, request and sampling types. The router imports only this package (and
`proto`), so it runs and is tested without torch."""

from core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockTiered,
    KVEvent,
    KVEventBatch,
    WorkerLoad,
)
from core.hashing import BlockHash, hash_block, hash_prompt_blocks, model_root_hash
from core.kv_layout import KVLayout
from core.request import FinishReason, RequestOutput, RequestTimings, TokenLogprob
from core.sampling import SamplingParams

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "BlockTiered",
    "FinishReason",
    "KVEvent",
    "KVEventBatch",
    "KVLayout",
    "RequestOutput",
    "RequestTimings",
    "SamplingParams",
    "TokenLogprob",
    "WorkerLoad",
    "hash_block",
    "hash_prompt_blocks",
    "model_root_hash",
]
