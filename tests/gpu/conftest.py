"""The GPU suite (`make test-gpu`): every test here is marked `gpu` and skipped, with the
reason, where it cannot mean anything: no CUDA device, or Triton's interpreter switched on.

The interpreter check matters in a run that also collects tests/engine: its kernel tests set
TRITON_INTERPRET=1 when imported, and a kernel decorated after that runs in the interpreter
even on a GPU, so this suite would test the wrong thing. `make test-gpu` collects tests/gpu
alone. The modules are still imported (and so import-checked) on machines without a GPU."""

from __future__ import annotations

import os

import pytest
import torch


def why_not_run() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device: the GPU suite runs on a machine with one (make test-gpu)"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (
            "TRITON_INTERPRET=1 (set by the CPU kernel tests in this run): the kernels would run "
            "in the interpreter; run the GPU suite on its own (make test-gpu)"
        )
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = why_not_run()
    if reason is not None:
        pytest.skip(reason)
