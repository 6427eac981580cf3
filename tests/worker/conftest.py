"""Fixtures the worker-level tests share."""

from __future__ import annotations

import pytest

from core.roles import WorkerRole
from decode_worker.worker import DecodeWorker
from prefill_worker.worker import PrefillWorker
from tests.support.worker_pair import PROMPT_BLOCKS, connect_pair, spec


@pytest.fixture
def shm_pair(tiny_model_dir, loop_thread):
    """A prefill and a decode worker (tiny model, two prompts' blocks each) in this process,
    connected over the shm backend."""
    model = tiny_model_dir()
    blocks = 2 * PROMPT_BLOCKS
    prefill = PrefillWorker(spec("p0", WorkerRole.PREFILL, model, blocks, "shm"))
    decode = DecodeWorker(spec("d0", WorkerRole.DECODE, model, blocks, "shm"))
    loop_thread.run(connect_pair(prefill, decode))
    yield prefill, decode
    prefill.shutdown()
    decode.shutdown()
