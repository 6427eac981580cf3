"""Attention over the paged KV cache: one backend interface (backend.py), the backends
(cpu_paged.py, torch_paged.py, triton_backend.py) and the lookup by name (registry.py)."""

from engine.attention.backend import AttentionBackend, AttentionMetadata, PrefillChunk
from engine.attention.registry import get_backend, register_backend

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "PrefillChunk",
    "get_backend",
    "register_backend",
]
