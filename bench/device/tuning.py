"""The device check's kernel tuning: the prefill kernel's candidate launches timed at head_dims
128, 64 and 256 (bench/engine/prefill_tuning.py) within TUNING_S, the decode kernel's at 128
(bench/engine/decode_tuning.py) within DECODE_TUNING_S, and the device's table written where
the engine reads it (engine/kernels/tuned.py):

    WORK/tuned/<device>.json   named by BATON_KERNEL_TUNING for the rest of the check: its
                               later sections, the servers it starts and a second call on
                               the same machine launch what it chose
    OUT/tuned/<device>.json    copied back from the device, to be committed to
                               engine/kernels/tuned/ with the run's JSON

The dry run times three prefill candidates (one of each way of reading keys, one of taller
tiles) and two decode candidates on tiny shapes under the interpreter and writes its table
the same way, without naming it to the process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from bench.device import figures
from bench.engine import decode_tuning, prefill_tuning
from engine.kernels import tuned

HEAD_DIMS = {128: 2, 64: 1, 256: 1}
"""In the order they are tuned, each with its weight in TUNING_S: the 8B shape's first,
with half of it."""
CASES = ((8, 1024), (2, 1024, 328))
"""The shapes a candidate is timed and checked on: 8 prompts of 1,024 tokens (~27 GFLOP at
32 heads of 128), and 2 whose last 328 tokens extend a cached prefix of 696 (a chunk of a
long prompt: 43 and a half pages, so a step of several pages leaves pages over)."""
TUNING_S = 100.0
"""What the prefill kernel's tuning may take, each head_dim its share and what the ones
before it left: past it no candidate starts (each one's compile is a second or more)."""
DECODE_CASES = ((64, 2048), (1, 4096))
"""The decode kernel's shapes (batch x context): the targets' batch-64 decode and one row
of a long context (split over it)."""
DECODE_TUNING_S = 30.0


def tune_kernels(device: torch.device, small: bool, work: Path, out_dir: Path) -> dict[str, Any]:
    """The attention kernels' launches tuned, the prefill kernel's then the decode kernel's
    (at head_dim 128, the 8B's), and the device's table written."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu dry run"
    timer = lambda fn: 1e3 * figures.timed(fn, device)  # noqa: E731
    prefill, rows = _tune_prefill(dtype, device, small, timer)
    decode, decode_rows = _tune_decode(dtype, device, small, timer)
    cases = " + ".join(f"{c[0]} x {c[1]}" + (f" (last {c[2]} new)" if c[2:] else "") for c in CASES)
    decode_cases = " and ".join(f"{b} x {n}" for b, n in DECODE_CASES)
    doc = {
        "device": name,
        "measured": f"{time.strftime('%Y-%m-%d')}, python -m bench.device.check (kernels): "
        f"prefill {cases} tokens a candidate, decode batch x context {decode_cases}",
        "prefill": prefill,
        "decode": decode,
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
    headline |= {f"decode {key}": "{block_n} keys, {num_warps} warps, {num_stages} stages"
                 .format(**e) for key, e in decode.items()}  # fmt: skip
    return {"table": doc, "files": written, "rows": rows, "decode_rows": decode_rows,
            "headline": headline}  # fmt: skip


Entries = dict[str, dict[str, Any]]
"""A kernel's part of the device's table: each (dtype, head_dim) key's launch."""


def _tune_prefill(
    dtype: torch.dtype, device: torch.device, small: bool, timer: Any
) -> tuple[Entries, dict[int, list[dict[str, Any]]]]:
    """The prefill kernel's candidates at each head_dim within its share of TUNING_S (in the
    dry run: head_dim 64, tiny shapes, three candidates); its entries and each head_dim's
    rows."""
    entries, rows = {}, {}
    weights, start, spent = {64: 1} if small else HEAD_DIMS, time.monotonic(), 0
    for head_dim, weight in weights.items():
        spent += weight
        deadline = start + TUNING_S * spent / sum(weights.values())
        hq, hk = (4, 2) if small else prefill_tuning.HEADS[head_dim]
        cases = ((2, 32), (1, 64, 24)) if small else CASES
        shapes = prefill_tuning.make_shapes(cases, hq, hk, head_dim, dtype, device)
        launches = prefill_tuning.candidates(dtype, head_dim)
        if small:  # one of each way of reading keys, and the taller tiles
            tall = next(c for c in launches if c.block_m > launches[0].block_m)
            launches = [launches[0], next(c for c in launches if c.whole_pages), tall]
        found = prefill_tuning.tune(dtype, device, head_dim, shapes, timer, launches=launches,
                                    deadline=deadline)  # fmt: skip
        rows[head_dim] = found
        entry = prefill_tuning.table_entry(found)
        if entry is not None:
            entries[tuned.key(dtype, head_dim)] = entry
    return entries, rows


def _tune_decode(
    dtype: torch.dtype, device: torch.device, small: bool, timer: Any
) -> tuple[Entries, list[dict[str, Any]]]:
    """The decode kernel's candidates at head_dim 128 (64 in the dry run, on a tiny shape,
    two candidates) within DECODE_TUNING_S; its entry and the rows."""
    hq, hk, head_dim = (4, 2, 64) if small else (32, 8, 128)
    cases = ((2, 32),) if small else DECODE_CASES
    shapes = decode_tuning.make_shapes(cases, hq, hk, head_dim, dtype, device)
    launches = decode_tuning.candidates(dtype)
    deadline = time.monotonic() + DECODE_TUNING_S
    rows = decode_tuning.tune(shapes, timer, launches[:2] if small else launches, deadline)
    entry = decode_tuning.table_entry(rows)
    return ({} if entry is None else {tuned.key(dtype, head_dim): entry}), rows


def name_earlier_table(work: Path) -> None:
    """A second call on the same machine: launch what the first call's tuning chose."""
    if (work / "tuned").is_dir():
        os.environ.setdefault(tuned.FOLDER_ENV, str(work / "tuned"))
