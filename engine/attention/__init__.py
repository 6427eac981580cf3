"""Attention over the paged KV cache: one backend interface, a registry, and backends."""

from engine.attention.backend import (
    AttentionBackend,
    AttentionMetadata,
    PrefillChunk,
    get_backend,
    register_backend,
)

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "PrefillChunk",
    "get_backend",
    "register_backend",
]
