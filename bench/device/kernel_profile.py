"""Where a step's device time goes, kernel by kernel: the device check's profile of a few
engine steps (torch.profiler, whose CUDA activity includes the kernels of replayed graphs).

    kernels     the busiest kernels: name, launches a step, microseconds a step, share
    busy_us     every kernel's time a step, summed
    wall_us     the steps' wall time a step (the device synchronized before and after)
    idle_share  1 - busy / wall: launch gaps, host waits and syncs between the kernels

A decode step at batch 1 that sits above its weight-read floor shows here whether the GEMMs
read below the copy rate, the small kernels (norms, rotary, attention) add up, or the device
waits between kernels. On the CPU (the dry run) the same code profiles the CPU's operators,
so the check's CPU test runs it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.device.figures import sync

TOP = 12


def per_step(run: Callable[[], Any], steps: int, device: torch.device) -> dict[str, Any]:
    """Profiles `steps` calls of `run` (each one engine step) run back to back."""
    on_cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if on_cuda else ProfilerActivity.CPU
    if on_cuda:  # CUPTI kept between the profiles: torch's teardown of it can upset graphs
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
    sync(device)
    with profile(activities=[activity]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        sync(device)
        wall_us = 1e6 * (time.perf_counter() - start) / steps
    rows = []
    for event in prof.key_averages():
        us = event.self_device_time_total if on_cuda else event.self_cpu_time_total
        if us > 0:
            rows.append({"name": event.key[:120], "launches": event.count / steps,
                         "us": us / steps})  # fmt: skip
    rows.sort(key=lambda row: -row["us"])
    busy = sum(row["us"] for row in rows)
    for row in rows:
        row["share"] = row["us"] / busy
    return {
        "steps": steps,
        "wall_us": wall_us,
        "busy_us": busy,
        "idle_share": max(0.0, 1 - busy / wall_us),
        "launches": sum(row["launches"] for row in rows),
        "kernels": rows[:TOP],
    }


def guarded(run: Callable[[], Any], steps: int, device: torch.device) -> dict[str, Any]:
    """`per_step`, or the error that stopped it: a profile is a figure beside the timings,
    never a reason to lose them."""
    try:
        return per_step(run, steps, device)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
