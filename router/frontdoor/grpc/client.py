"""A small synchronous Python client for Baton's gRPC API (`baton.v1`).

from router.frontdoor.grpc.client import BatonClient

with BatonClient("127.0.0.1:50051") as client:
    for chunk in client.generate("Tell me about batons.", max_tokens=32):
        print(chunk.text, end="", flush=True)
    print(client.complete("Hello", max_tokens=8, temperature=0).text)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.baton.v1 import admin_pb2, admin_pb2_grpc, generate_pb2, generate_pb2_grpc

Prompt = str | list[int] | list[dict[str, str]]
"""Text, token ids, or chat messages ({"role", "content"})."""


def build_request(
    prompt: Prompt, request_id: str = "", add_special_tokens: bool | None = None, **sampling: Any
) -> generate_pb2.GenerateRequest:
    """A GenerateRequest; `sampling` holds SamplingParams fields (max_tokens, temperature,
    top_p, top_k, min_p, seed, stop, ..., logprobs)."""
    msg = generate_pb2.GenerateRequest(
        request_id=request_id, sampling=generate_pb2.SamplingParams(**sampling)
    )
    if isinstance(prompt, str):
        msg.text = prompt
    elif prompt and all(isinstance(m, dict) for m in prompt):
        msg.chat.messages.extend(generate_pb2.ChatMessage(**m) for m in prompt)  # type: ignore[arg-type]
    else:
        msg.token_ids.ids.extend(prompt)  # type: ignore[arg-type]
    if add_special_tokens is not None:
        msg.add_special_tokens = add_special_tokens
    return msg


class BatonClient:
    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        admin_token: str | None = None,
    ):
        self.channel = grpc.insecure_channel(target)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._generate = generate_pb2_grpc.GenerateServiceStub(self.channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._admin_metadata = (("authorization", f"Bearer {admin_token}"),) if admin_token else ()

    # -- generation --------------------------------------------------------------------
    def generate(
        self, prompt: Prompt, *, timeout: float | None = None, **sampling: Any
    ) -> Iterator[generate_pb2.GenerateResponse]:
        """Streamed deltas (new tokens and text per message); the last has `finished` and
        `usage`. The returned call also has `.cancel()`, which aborts the request."""
        return self._generate.Generate(
            build_request(prompt, **sampling), timeout=timeout, metadata=self._metadata
        )

    def complete(
        self, prompt: Prompt, *, timeout: float | None = None, **sampling: Any
    ) -> generate_pb2.GenerateResponse:
        """The whole completion at once (GenerateUnary)."""
        return self._generate.GenerateUnary(
            build_request(prompt, **sampling), timeout=timeout, metadata=self._metadata
        )

    def tokenize(
        self, prompt: str | list[dict[str, str]], add_special_tokens: bool = True
    ) -> list[int]:
        msg = generate_pb2.TokenizeRequest(add_special_tokens=add_special_tokens)
        if isinstance(prompt, str):
            msg.text = prompt
        else:
            msg.chat.messages.extend(generate_pb2.ChatMessage(**m) for m in prompt)
        return list(self._generate.Tokenize(msg, metadata=self._metadata).token_ids)

    def is_serving(self, timeout: float = 5.0) -> bool:
        reply = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    # -- admin (needs admin_token) -----------------------------------------------------
    def cluster_state(self) -> admin_pb2.ClusterState:
        return self._admin.GetClusterState(
            admin_pb2.GetClusterStateRequest(), metadata=self._admin_metadata
        )

    def scale(self, pool: str, size: int) -> admin_pb2.ClusterState:
        return self._admin.ScalePool(
            admin_pb2.ScalePoolRequest(pool=pool, size=size), metadata=self._admin_metadata
        )

    def drain(self, worker_id: str) -> admin_pb2.ClusterState:
        return self._admin.DrainWorker(
            admin_pb2.DrainWorkerRequest(worker_id=worker_id), metadata=self._admin_metadata
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BatonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
