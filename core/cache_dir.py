"""Where Baton keeps what it makes once per machine and reuses: `$XDG_CACHE_HOME/baton/NAME`
(`~/.cache/baton/NAME` without it), the XDG base-directory convention pip and torch follow."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """The folder for `name`'s entries (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "baton" / name
