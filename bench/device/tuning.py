"""The device check's kernel tuning: the prefill kernel's candidate launches timed at head_dims
128, 64 and 256 (bench/engine/prefill_tuning.py) within TUNING_S, and the device's table
written where the engine reads it (engine/kernels/tuned.py):

    WORK/tuned/<device>.json   named by BATON_KERNEL_TUNING for the rest of the check: its
                               later sections, the servers it starts and a second call on
                               the same machine launch what it chose
    OUT/tuned/<device>.json    copied back from the device, to be committed to
                               engine/kernels/tuned/ with the run's JSON

The dry run times three candidates (one of each way of reading keys, one of taller tiles)
on a tiny shape under the interpreter and writes its table the same way, without naming it
to the process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from bench.device import figures
from bench.engine import prefill_tuning
from engine.kernels import tuned

HEAD_DIMS = (128, 64, 256)
"""In the order they are tuned: the 8B shape's first."""
CASES = ((8, 1024),)
"""One shape a candidate: 8 prompts of 1,024 tokens (~27 GFLOP at 32 heads of 128)."""
TUNING_S = 120.0
"""What the tuning may take, each head_dim its share and what the ones before it left:
past it no candidate starts (each one's compile is a second or more)."""


def tune_prefill(device: torch.device, small: bool, work: Path, out_dir: Path) -> dict[str, Any]:
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu dry run"
    prefill, rows = {}, {}
    head_dims, start = (64,) if small else HEAD_DIMS, time.monotonic()
    for i, head_dim in enumerate(head_dims):
        deadline = start + TUNING_S * (i + 1) / len(head_dims)
        hq, hk = (4, 2) if small else prefill_tuning.HEADS[head_dim]
        cases = ((2, 32),) if small else CASES
        shapes = prefill_tuning.make_shapes(cases, hq, hk, head_dim, dtype, device)
        launches = prefill_tuning.candidates(dtype, head_dim)
        if small:  # one of each way of reading keys, and the taller tiles
            tall = next(c for c in launches if c.block_m > launches[0].block_m)
            launches = [launches[0], next(c for c in launches if c.whole_pages), tall]
        timer = lambda fn: 1e3 * figures.timed(fn, device)  # noqa: E731
        found = prefill_tuning.tune(dtype, device, head_dim, shapes, timer, launches=launches,
                                    deadline=deadline)  # fmt: skip
        rows[head_dim] = found
        entry = prefill_tuning.table_entry(found)
        if entry is not None:
            prefill[tuned.key(dtype, head_dim)] = entry
    doc = {
        "device": name,
        "measured": f"{time.strftime('%Y-%m-%d')}, python -m bench.device.check (kernels), "
        f"{' + '.join(f'{b} x {n}' for b, n in CASES)} tokens a candidate",
        "prefill": prefill,
    }
    written = []
    for folder in (work / "tuned", out_dir / "tuned"):
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / tuned.file_name(name)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        written.append(str(path))
    if device.type == "cuda":
        tuned.use(name, doc)
        os.environ[tuned.FOLDER_ENV] = str(work / "tuned")
    headline = {
        f"prefill {key}": f"{'whole pages' if e['whole_pages'] else 'gather'} {e['block_n']}"
        for key, e in prefill.items()
    }
    return {"table": doc, "files": written, "rows": rows, "headline": headline}


def name_earlier_table(work: Path) -> None:
    """A second call on the same machine: launch what the first call's tuning chose."""
    if (work / "tuned").is_dir():
        os.environ.setdefault(tuned.FOLDER_ENV, str(work / "tuned"))
