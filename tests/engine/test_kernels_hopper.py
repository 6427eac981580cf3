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
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.hopper_compile"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["errors"] == []
    assert sorted(result["compiled"]) == result["kernels"], "a kernel no case compiles"
    prefill = result["compiled"]["_prefill_kernel"]
    assert any("whole_pages=True" in case for case in prefill)  # tensor descriptors (TMA)
