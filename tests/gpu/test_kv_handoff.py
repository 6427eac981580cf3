"""Disaggregated on one GPU: a prefill worker in a child process and a decode worker in this
one, both with their KV cache in VRAM, the prompt's KV moved block by block over NIXL and
over CUDA IPC (kv_transfer/cuda_ipc_driver.py). Every prompt's tokens equal one-process
decoding's (an LLM on the same GPU, one prompt at a time as here, in float32), and again once
the decode worker caches the prefixes and is sent only the rest. The NIXL case is skipped
where nixl cannot be imported."""

from __future__ import annotations

import asyncio

import pytest

from core.config import EngineConfig
from core.request import EngineRequest
from core.roles import WorkerRole
from decode_worker.worker import DecodeWorker
from engine import LLM
from kv_transfer import unavailable_reason
from tests.engine.test_parity import GREEDY, make_prompts
from tests.gpu.prefill_process import prefill_worker_main
from tests.kv_transfer.peer_process import PipedProcess
from tests.support.worker_pair import admit_and_decode
from worker.records import WorkerSpec

pytestmark = pytest.mark.gpu

TIMEOUT_S = 120.0
ENGINE = dict(device="cuda", dtype="float32", num_kv_blocks=512)


def spec(worker_id: str, role: WorkerRole, model_dir: str, backend: str) -> WorkerSpec:
    return WorkerSpec(worker_id, role, model_dir, EngineConfig(**ENGINE), transport=backend)


async def disaggregated(prefill: PipedProcess, decode: DecodeWorker, request: EngineRequest):
    """The request path of router/cluster/request_path.py, reduced to its calls: reserve on
    the decode worker, prefill (sending the KV), admit, read the deltas. Returns (tokens,
    prompt blocks the decode worker already held)."""
    res = await decode.reserve(request, TIMEOUT_S, prefill.name)
    skip = res.skip_blocks
    reply = await asyncio.to_thread(
        prefill.call, "prefill", request, decode.worker_id, res.dst_block_ids, skip, TIMEOUT_S,
        timeout_s=TIMEOUT_S,
    )  # fmt: skip
    if reply.output.finished:  # the first token ended it
        await decode.abort(request.request_id)
        return reply.output.new_token_ids, skip
    tokens = await admit_and_decode(
        decode, request.request_id, reply.first_token, reply.logprob, TIMEOUT_S
    )
    return tokens, skip


@pytest.mark.parametrize("backend", ["nixl", "cuda_ipc"])
def test_prefill_to_decode_equals_one_process(tiny_model_dir, loop_thread, backend) -> None:
    reason = unavailable_reason(backend)
    if reason is not None:
        pytest.skip(reason)
    model_dir = str(tiny_model_dir("llama"))
    one_process = LLM(model_dir, **ENGINE)
    prompts = make_prompts(one_process.engine.model_config.vocab_size)
    want = [one_process.generate([p], GREEDY)[0].token_ids for p in prompts]

    prefill = PipedProcess(
        prefill_worker_main,
        (spec("p0", WorkerRole.PREFILL, model_dir, backend),),
        start_timeout_s=300,
    )
    decode = DecodeWorker(spec("d0", WorkerRole.DECODE, model_dir, backend))
    try:
        assert decode.info().transport_backend == backend
        assert decode.group.rank.engine.runner.kv_cache.is_cuda
        prefill.call("route", loop_thread.run(decode.accept(prefill.metadata)))
        skipped = []
        for round_ in range(2):  # the second: prefixes come from the decode worker's cache
            got = []
            skipped.append(0)
            for i, prompt in enumerate(prompts):
                request = EngineRequest(f"r{round_}-{i}", prompt, GREEDY)
                tokens, skip = loop_thread.run(disaggregated(prefill, decode, request), TIMEOUT_S)
                got.append(tokens)
                skipped[-1] += skip
            assert got == want, f"round {round_}"
        assert skipped[1] > skipped[0], "the second round sent as many blocks as the first"
    finally:
        decode.shutdown()
        prefill.stop()
