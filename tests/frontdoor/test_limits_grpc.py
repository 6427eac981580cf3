"""The door's limits on the gRPC `GenerateService` (router/frontdoor/limits.py): per-key
rate limits and quotas (RESOURCE_EXHAUSTED), the door's admission (UNAVAILABLE), both with
`retry-after`; the largest request message; and one count for the HTTP and gRPC doors of
a front door. Refused calls never reach the engine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from router.frontdoor.grpc.client import BatonClient
from router.frontdoor.http.app import create_app
from router.frontdoor.limits import DoorControls, DoorLimits
from tests.frontdoor.conftest import wait_until_idle
from tests.frontdoor.test_limits_http import CountingBackend, HeldStream, body, post
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

LONG = {"max_tokens": 200, "ignore_eos": True}


@pytest.fixture
def doors(backend: LocalBackend) -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def start(**limits: Any) -> tuple[Callable[..., BatonClient], CountingBackend, Any]:
        counting = CountingBackend(backend)
        controls = DoorControls(DoorLimits(**limits))
        grpc_door = GRPCServerThread(counting, None, admin_token="x", limits=controls).start()
        http_door = HTTPServerThread(
            create_app(counting, None, admin_token="x", limits=controls)  # type: ignore[arg-type]
        ).start()
        started.extend([grpc_door, http_door])

        def client(key: str | None = None) -> BatonClient:
            c = BatonClient(grpc_door.target, api_key=key)
            started.append(c)
            return c

        return client, counting, http_door

    yield start
    for s in reversed(started):
        s.close() if isinstance(s, BatonClient) else s.stop()
    assert wait_until_idle(backend) == (0, 0)


def retry_after(e: grpc.RpcError) -> int:
    return int(dict(e.trailing_metadata() or ())["retry-after"])


def test_rate_limit_per_key_is_resource_exhausted(doors) -> None:
    client, counting, _ = doors(rate_per_s=0.2, burst=1)
    alice = client("alice")
    assert alice.complete("hi", max_tokens=1, timeout=30).finished
    with pytest.raises(grpc.RpcError) as refused:
        alice.complete("hi", max_tokens=1, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "0.2 requests/s" in refused.value.details()
    assert 1 <= retry_after(refused.value) <= 5
    with pytest.raises(grpc.RpcError) as streamed:
        list(alice.generate("hi", max_tokens=1, timeout=30))
    assert streamed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert counting.num_requests == 1  # the refused calls did no engine work
    assert client("bob").complete("hi", max_tokens=1, timeout=30).finished


def test_a_full_door_is_unavailable_and_frees_its_slot(doors) -> None:
    client, counting, _ = doors(max_concurrent=1, max_queued=0)
    held = client().generate("hi", timeout=30, **LONG)
    next(held)  # streaming: it holds the door's only slot
    with pytest.raises(grpc.RpcError) as refused:
        client().complete("hi", max_tokens=1, timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "at capacity" in refused.value.details() and retry_after(refused.value) >= 1
    held.cancel()
    deadline = time.monotonic() + 10
    while True:  # the cancelled stream gives its slot back
        try:
            assert client().complete("hi", max_tokens=1, timeout=30).finished
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
            time.sleep(0.05)
    assert counting.num_requests == 2


def test_a_message_over_the_body_limit_is_refused(doors) -> None:
    client, counting, _ = doors(max_body_bytes=2048)
    with pytest.raises(grpc.RpcError) as refused:
        client().complete("word " * 1000, max_tokens=1, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert counting.num_requests == 0
    assert client().complete("hi", max_tokens=1, timeout=30).finished


def test_the_two_doors_share_a_keys_quota(doors, backend) -> None:
    client, counting, http_door = doors(max_concurrent_per_key=1)
    with HeldStream(http_door, body(backend, stream=True, **LONG), "alice"):
        with pytest.raises(grpc.RpcError) as refused:
            client("alice").complete("hi", max_tokens=1, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert client("bob").complete("hi", max_tokens=1, timeout=30).finished
    held = client("carol").generate("hi", timeout=30, **LONG)
    next(held)  # now gRPC holds carol's one request
    response = post(http_door, body(backend), "carol")
    assert response.status_code == 429, response.text
    held.cancel()
    assert counting.num_requests == 3
