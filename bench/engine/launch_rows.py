"""What the attention kernels' tunings (prefill_tuning.py, decode_tuning.py) share: a
candidate's row measured or told why not, and the table entry of the best row."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

RAN_OUT = "the tuning's time ran out"


def measured(
    row: dict[str, Any], key: str, measure: Callable[[], Any], deadline: float | None
) -> dict[str, Any]:
    """`row` with `row[key]` = measure(); past `deadline` (time.monotonic()) it is skipped,
    and a candidate that fails (does not compile, disagrees with the reference) is reported
    with its error, never fatal to the tuning."""
    if deadline is not None and time.monotonic() > deadline:
        row["skipped"] = RAN_OUT
        return row
    try:
        row[key] = measure()
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    return row


def entry(rows: list[dict[str, Any]], launch: type, key: str) -> dict[str, Any] | None:
    """The first row (the best: rows come sorted) with a `key`, as `launch`'s fields."""
    fields = [f.name for f in dataclasses.fields(launch)]
    for row in rows:
        if row[key] is not None:
            return {name: row[name] for name in fields}
    return None
