"""The open-loop load generator: send each request at its arrival time, whatever is still
in flight, and time its stream.

Open loop matters: a closed-loop client (N users, each waiting for its answer) slows down
with the server and hides queueing; here the offered load is fixed by the arrival times, so
an overloaded server shows up as growing TTFT and, past the time bound, errors.

Bounds: requests are only *sent* during `max_duration_s`; whatever is still running
`drain_timeout_s` later is cancelled and counted as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from loadgen.metrics import RequestResult
from loadgen.workloads import TraceRequest

DEADLINE_ERROR = "cancelled at the benchmark deadline"


@dataclass
class LoadRun:
    results: list[RequestResult]
    duration_s: float
    """Start of the run to the last completion (or to the deadline)."""
    num_not_sent: int
    """Requests whose arrival fell after `max_duration_s`."""


async def stream_completion(
    client: httpx.AsyncClient, model: str, req: TraceRequest, result: RequestResult
) -> None:
    """POST one streaming /v1/completions and fill `result` (never raises for a failed
    request: the failure is the result)."""
    body = {
        "model": model,
        "prompt": req.prompt_token_ids,
        "max_tokens": req.output_length,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "ignore_eos": True,  # exact output lengths: the workload decides them
    }
    start = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                result.error = f"HTTP {resp.status_code}: {_error_message(resp.text)}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = f"stream error: {_error_message(json.dumps(event))}"
                    return
                if event.get("choices"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                usage = event.get("usage")
                if usage:
                    result.num_output_tokens = usage["completion_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    result.num_cached_tokens = details.get("cached_tokens") or 0
    except httpx.HTTPError as e:
        # Before the first token or mid-stream tell different stories (a keep-alive
        # connection the server closed as it was reused, or a stream the server broke).
        when = "before the first token" if result.ttft_s is None else "mid-stream"
        result.error = f"{type(e).__name__} {when}: {e}"[:200]
        return
    result.e2e_s = time.perf_counter() - start
    if result.ttft_s is None:
        result.error = "no tokens streamed"
    else:
        result.ok = True


async def stream_grpc(stub: Any, req: TraceRequest, result: RequestResult) -> None:
    """The same over gRPC `GenerateService.Generate` (a message per batch of new tokens)."""
    import grpc

    from router.frontdoor.grpc.client import build_request

    msg = build_request(
        req.prompt_token_ids, max_tokens=req.output_length, temperature=0.0, ignore_eos=True
    )
    start = time.perf_counter()
    last: float | None = None
    try:
        async for out in stub.Generate(msg):
            if out.token_ids:
                now = time.perf_counter()
                if last is None:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
            if out.finished:
                result.num_output_tokens = out.usage.completion_tokens
                result.num_cached_tokens = out.usage.cached_tokens
    except grpc.aio.AioRpcError as e:
        result.error = f"gRPC {e.code().name}: {e.details()}"[:200]
        return
    result.e2e_s = time.perf_counter() - start
    if result.ttft_s is None:
        result.error = "no tokens streamed"
    else:
        result.ok = True


def _error_message(text: str) -> str:
    """The error's message, first line only: errors are counted by message, and a remote
    traceback in it would make every occurrence a kind of its own."""
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = text
    lines = re.sub(r"\x1b\[[0-9;]*m", "", message).strip().splitlines()
    return lines[0][:200] if lines else ""


async def run_load(
    base_url: str,
    model: str,
    requests: Sequence[TraceRequest],
    *,
    max_duration_s: float = 120.0,
    drain_timeout_s: float = 60.0,
    api_key: str | None = None,
    progress: bool = True,
    label: str = "",
    grpc_target: str | None = None,
) -> LoadRun:
    """Send `requests` open-loop at their `arrival_s`; return one result per sent request.
    With `grpc_target` (host:port) they go to the gRPC front door instead of HTTP."""
    if max_duration_s <= 0 or drain_timeout_s < 0:
        raise ValueError("max_duration_s must be > 0 and drain_timeout_s >= 0")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # Idle connections expire on our side before uvicorn's 5 s keep-alive timeout does (both
    # default to 5 s): otherwise a request may be sent on a connection the server is closing.
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256, keepalive_expiry=2.0)
    timeout = httpx.Timeout(max_duration_s + drain_timeout_s, connect=10.0)
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    to_send = [r for r in ordered if r.arrival_s <= max_duration_s]
    bar = tqdm(total=len(to_send), desc=label or "requests", unit="req", disable=not progress,
               leave=False)  # fmt: skip
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[None]] = []
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=timeout)
        )
        stub = await _grpc_stub(stack, grpc_target) if grpc_target else None
        start = time.perf_counter()

        async def one(req: TraceRequest, res: RequestResult) -> None:
            try:
                if stub is not None:
                    await stream_grpc(stub, req, res)
                else:
                    await stream_completion(client, model, req, res)
            finally:
                bar.update(1)

        for req in to_send:
            delay = req.arrival_s - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            res = RequestResult(sent_s=time.perf_counter() - start,
                                num_prompt_tokens=len(req.prompt_token_ids))  # fmt: skip
            results.append(res)
            tasks.append(asyncio.create_task(one(req, res)))
        hard_deadline = start + max_duration_s + drain_timeout_s
        if tasks:
            _, pending = await asyncio.wait(
                tasks, timeout=max(0.0, hard_deadline - time.perf_counter())
            )
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - start
    bar.close()
    for r in results:
        if not r.ok and not r.error:
            r.error = DEADLINE_ERROR
    return LoadRun(results, duration, len(ordered) - len(to_send))


async def _grpc_stub(stack: contextlib.AsyncExitStack, target: str) -> Any:
    import grpc

    from proto.baton.v1 import generate_pb2_grpc

    channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
    return generate_pb2_grpc.GenerateServiceStub(channel)


async def scrape_metrics(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The /metrics exposition, or None if the server has none (or is unreachable)."""
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as client:
            resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None
