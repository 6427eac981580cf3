"""The cluster-wide prefix index: which worker caches which blocks, fed by KV events, kept in
this process (`memory`) or shared by router replicas through Redis (`redis`)."""

from __future__ import annotations

from typing import Any

from router.routing.index.store import IndexStore

STORE_KINDS = ("memory", "redis")


def make_store(kind: str = "memory", **kwargs: Any) -> IndexStore:
    """Build a store by name: "memory" or "redis" (kwargs: url, namespace, ...). The Redis
    store is imported only when asked for, so the embedded default needs no redis package."""
    if kind == "memory":
        from router.routing.index.store import InProcessStore

        return InProcessStore(**kwargs)
    if kind == "redis":
        from router.routing.index.redis_store import RedisStore

        return RedisStore(**kwargs)
    raise ValueError(f"unknown index store {kind!r}; choose from {list(STORE_KINDS)}")
