"""What a worker (and its engine) does: the one enum for roles and pools.

A `StrEnum`, so a role compares equal to its name and travels as that string through
msgspec, JSON, Redis and Ray resources ("prefill" is also the custom Ray resource that pins a
prefill worker to a node type).
"""

from __future__ import annotations

import enum


class WorkerRole(enum.StrEnum):
    PREFILL = "prefill"
    """Runs prompts and ships their KV to a decode worker; parks each request after its
    first token until the KV has been handed over."""
    DECODE = "decode"
    """Reserves blocks for prompts prefilled elsewhere and decodes them; its engine runs
    in the unified role, so it can also prefill short prompts itself."""
    UNIFIED = "unified"
    """Both phases on one worker: the colocated baseline."""

    @classmethod
    def parse(cls, value: str) -> WorkerRole:
        """`value` as a role, or a ValueError that lists the roles."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(r.value for r in cls)
            raise ValueError(f"unknown worker role {value!r}; choose from {names}") from None
