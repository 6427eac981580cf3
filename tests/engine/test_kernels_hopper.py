"""Every Triton kernel compiles for a Hopper GPU (sm_90), on the CPU: Triton's own compiler
and ptxas through the engine's host wrappers, every dtype, head dim, split, way of reading
keys and quantized cache the engine launches (tests/support/hopper_compile.py). The
interpreter runs a kernel's Python, so a kernel can pass every CPU test and not compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_kernel_compiles_for_hopper() -> None:
    """The cases split between a process a core (each compile is Triton's and ptxas' work on
    one core; ~90 of them from a cold cache)."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    shards = max(1, min(4, os.cpu_count() or 1))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.hopper_compile", f"{i}/{shards}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(shards)
    ]
    try:
        outputs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    compiled: dict[str, list[str]] = {}
    errors, kernels = [], None
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        result = json.loads(out)
        errors += result["errors"]
        kernels = result["kernels"]
        for name, cases in result["compiled"].items():
            compiled.setdefault(name, []).extend(cases)
    assert errors == []
    assert sorted(compiled) == kernels, "a kernel no case compiles"
    assert any("whole_pages=True" in case for case in compiled["_prefill_kernel"])  # TMA
