"""Attention backends by name: the lookup the model runner builds its backend from.

This module, not the interface in backend.py, knows the implementations: each backend
imports the interface, so an interface that imported its backends (even inside a function)
would close a circle. Here the arrows all point one way: registry -> backends -> interface.
"""

from __future__ import annotations

from engine.attention.backend import AttentionBackend
from engine.attention.cpu_paged import CPUPagedAttention
from engine.attention.torch_paged import TorchPagedAttention
from engine.attention.triton_backend import TritonPagedAttention

_REGISTRY: dict[str, type[AttentionBackend]] = {
    cls.name: cls for cls in (TorchPagedAttention, CPUPagedAttention, TritonPagedAttention)
}


def register_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    """Adds (or replaces) the backend under `cls.name`, for backends outside this package;
    usable as a class decorator. Mutates the process-wide table `get_backend` reads."""
    _REGISTRY[cls.name] = cls
    return cls


def get_backend(name: str) -> AttentionBackend:
    """A new instance of the backend called `name`; ValueError naming the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]()
