"""The gRPC front door: streaming, unary, tokenize, cancellation, deadlines, bad input,
health, reflection and the admin service, against a real tiny engine."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from core.sampling import SamplingParams
from proto.baton.v1 import generate_pb2
from router.frontdoor.admin_api import ClusterState, PoolInfo
from router.frontdoor.backend import GenerateRequest
from router.frontdoor.grpc import convert
from router.frontdoor.grpc.client import BatonClient
from tests.frontdoor.conftest import ADMIN_TOKEN, MAX_MODEL_LEN, engine_usage, wait_until_idle
from tests.support.grpc_server import GRPCServerThread
from tests.support.in_process_admin import InProcessAdmin
from tests.support.local_backend import LocalBackend


@pytest.fixture()
def client(grpc_server: GRPCServerThread) -> BatonClient:
    c = BatonClient(grpc_server.target, admin_token=ADMIN_TOKEN)
    yield c
    c.close()


def test_stream_deltas_add_up_to_the_unary_answer(client: BatonClient) -> None:
    args = dict(max_tokens=12, temperature=0.7, seed=11, ignore_eos=True, logprobs=1)
    chunks = list(client.generate("pass the baton", timeout=30, **args))
    whole = client.complete("pass the baton", timeout=30, **args)
    assert [t for c in chunks for t in c.token_ids] == list(whole.token_ids)
    assert "".join(c.text for c in chunks) == whole.text
    assert len(whole.token_ids) == 12 and len(whole.logprobs) == 12
    last = chunks[-1]
    assert last.finished and not any(c.finished for c in chunks[:-1])
    assert last.finish_reason == generate_pb2.FINISH_REASON_LENGTH
    assert last.usage.completion_tokens == 12
    assert last.usage.prompt_tokens == len(client.tokenize("pass the baton"))


def test_prompt_logprobs_on_the_first_message(client: BatonClient) -> None:
    ids = client.tokenize("pass the baton along")
    args = dict(max_tokens=3, temperature=0.0, prompt_logprobs=2)
    chunks = list(client.generate(ids, timeout=30, **args))
    whole = client.complete(ids, timeout=30, **args)
    first = list(chunks[0].prompt_logprobs)
    assert not any(c.prompt_logprobs for c in chunks[1:])
    assert first == list(whole.prompt_logprobs) and len(first) == len(ids) - 1
    assert [lp.token_id for lp in first] == ids[1:]
    assert all(lp.rank >= 1 and len(lp.top) == 2 for lp in first)


def test_chat_and_token_prompts(client: BatonClient, backend: LocalBackend) -> None:
    chat = [{"role": "user", "content": "hi"}]
    ids = client.tokenize(chat)
    text = backend.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert ids == backend.tokenizer.encode(text, add_special_tokens=False)
    a = client.complete(chat, max_tokens=5, temperature=0.0)
    b = client.complete(ids, max_tokens=5, temperature=0.0)
    assert list(a.token_ids) == list(b.token_ids)


def test_cancel_mid_stream_frees_the_blocks(client: BatonClient, backend: LocalBackend) -> None:
    call = client.generate("a long story", max_tokens=200, ignore_eos=True, timeout=30)
    received = [next(call), next(call)]
    assert all(r.token_ids for r in received)
    live, used = engine_usage(backend)
    assert live == 1 and used > 0  # the request holds blocks while it streams
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.CANCELLED
    assert wait_until_idle(backend) == (0, 0)


def test_deadline_exceeded_frees_the_blocks(client: BatonClient, backend: LocalBackend) -> None:
    with pytest.raises(grpc.RpcError) as info:
        client.complete("slow", max_tokens=200, ignore_eos=True, timeout=0.05)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until_idle(backend) == (0, 0)


@pytest.mark.parametrize(
    ("prompt", "sampling", "needle"),
    [
        ("hi", {"temperature": -1.0}, "temperature"),
        ("hi", {"top_p": 0.0}, "top_p"),
        ("hi", {"max_tokens": MAX_MODEL_LEN}, "max_tokens"),
        ([10**6], {}, "vocabulary"),
        ([], {}, "prompt"),
        ([1] * MAX_MODEL_LEN, {}, "context"),
        ("hi", {"logprobs": 99}, "logprobs"),
    ],
)
def test_bad_input_is_invalid_argument(
    client: BatonClient, prompt: object, sampling: dict, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        client.complete(prompt, timeout=10, **sampling)  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in info.value.details()


def test_health_and_reflection(grpc_server: GRPCServerThread, client: BatonClient) -> None:
    assert client.is_serving()
    with grpc.insecure_channel(grpc_server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="baton.v1.GenerateService"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        names = {s.name for s in reply.list_services_response.service}
        assert {
            "baton.v1.GenerateService",
            "baton.v1.AdminService",
            "grpc.health.v1.Health",
        } <= names
        request = reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="baton.v1.GenerateService"
        )
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        assert reply.file_descriptor_response.file_descriptor_proto


def test_admin_service_needs_the_token(grpc_server: GRPCServerThread, client: BatonClient) -> None:
    state = client.cluster_state()
    assert {p.name for p in state.pools} >= {"prefill", "decode"}
    with BatonClient(grpc_server.target, admin_token="wrong") as intruder:
        with pytest.raises(grpc.RpcError) as info:
            intruder.cluster_state()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        client.scale("nosuchpool", 1)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        client.drain("nosuchworker")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_cluster_state_says_why_a_pool_was_refused() -> None:
    why = "decode pool: block_size 32 where the prefill pool has 16"
    msg = convert.cluster_state(ClusterState(pools=(PoolInfo("decode", 1),), refused=(why,)))
    assert list(msg.refused) == [why] and msg.pools[0].name == "decode"


def test_cluster_state_counts_prompt_tokens(client: BatonClient, admin: InProcessAdmin) -> None:
    def counts() -> dict[str, tuple[int, int]]:
        state = client.cluster_state()
        return {
            w.worker_id: (w.num_prompt_tokens, w.num_cached_prompt_tokens)
            for p in state.pools
            for w in p.workers
        }

    [worker] = admin.workers("prefill")
    prompt = list(range(100, 140))  # 2 full blocks of 16 and a part
    greedy = SamplingParams(max_tokens=2, temperature=0.0)

    async def twice() -> None:
        for i in range(2):
            request = GenerateRequest(f"count-{i}", prompt, greedy, 30.0)
            async for _ in worker.backend.generate(request):
                pass

    before = counts()
    asyncio.run(twice())
    after = counts()
    grown = {w: (after[w][0] - before[w][0], after[w][1] - before[w][1]) for w in after}
    # The second prompt found the first's two full blocks cached; other workers saw nothing.
    assert grown.pop(worker.worker_id) == (2 * len(prompt), 32)
    assert set(grown.values()) <= {(0, 0)}


def test_the_cluster_state_lists_each_workers_adapters() -> None:
    from core.events import WorkerLoad
    from router.frontdoor.admin_api import WorkerStatus

    load = WorkerLoad("d0", "decode", 1, 0, 0, 10, 20, adapters=("sql", "chat"), max_loras=4)
    worker = WorkerStatus.of("d0", "decode", "ready", load)
    assert worker.adapters == ("sql", "chat")
    msg = convert.cluster_state(ClusterState(pools=(PoolInfo("decode", 1, (worker,)),)))
    assert list(msg.pools[0].workers[0].adapters) == ["sql", "chat"]
