"""What the multi-host tests run inside a host of the bed (the test process itself stays in
the machine's own namespace, which has no route into the bed).

    python -m tests.multinode.client <command> '<json arguments>'

prints one JSON line. Commands:
    streams   gRPC streams, `concurrency` at a time: per prompt its token ids, or its error
    state     the cluster state from the admin API (pools, workers and their states)
    metric    the value of one Prometheus sample of a front door
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx

from proto.baton.v1 import admin_pb2
from router.frontdoor.grpc.client import BatonClient


def streams(
    target: str, prompts: list[list[int]], max_tokens: int, concurrency: int, timeout_s: float
) -> list[dict[str, Any]]:
    def one(prompt: list[int]) -> dict[str, Any]:
        token_ids: list[int] = []
        started = time.monotonic()
        with BatonClient(target) as client:
            try:
                stream = client.generate(
                    prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                    timeout=timeout_s,
                )  # fmt: skip
                for chunk in stream:
                    token_ids.extend(chunk.token_ids)
            except grpc.RpcError as e:
                return {"token_ids": token_ids, "error": f"{e.code().name}: {e.details()}"}
        return {"token_ids": token_ids, "error": None, "seconds": time.monotonic() - started}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def state(target: str, admin_token: str) -> dict[str, Any]:
    with BatonClient(target, admin_token=admin_token) as client:
        reply = client.cluster_state()
    return {
        p.name: {
            "desired": p.desired_size,
            "workers": {w.worker_id: admin_pb2.WorkerState.Name(w.state) for w in p.workers},
        }
        for p in reply.pools
    }


def metric(url: str, name: str) -> float:
    body = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in body.splitlines() if line.split(" ")[0] == name)


def main() -> None:
    command, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = {"streams": streams, "state": state, "metric": metric}[command](**arguments)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
