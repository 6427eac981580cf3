"""Paged KV-cache bookkeeping (ints only: no tensors here) and the cache tensor itself."""

from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.manager import KVCacheManager

__all__ = ["BlockPool", "KVCacheManager"]
