"""How many threads a worker process computes with: a fixed, small number, so the workers
of one machine share its cores instead of each spawning one thread per core."""

from __future__ import annotations

import os

import torch


def pin_threads(num_threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)
