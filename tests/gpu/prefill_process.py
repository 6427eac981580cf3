"""A prefill worker in a child process, driven over a pipe by
`tests.kv_transfer.peer_process.PipedProcess`: it greets with its worker id and transport
metadata, then runs `route` (where the decode worker takes its KV: the `Routes` its `accept`
answered with) and `prefill` commands on its own event loop."""

from __future__ import annotations

import asyncio
from multiprocessing.connection import Connection

from worker.records import WorkerSpec


def prefill_worker_main(conn: Connection, spec: WorkerSpec) -> None:
    from prefill_worker.worker import PrefillWorker

    worker = PrefillWorker(spec)
    loop = asyncio.new_event_loop()
    conn.send((worker.worker_id, worker.info().transport_metadata))
    while True:
        command, *args = conn.recv()
        if command == "exit":
            worker.shutdown()
            conn.send(("ok", None))
            return
        try:
            method = {"route": worker.route, "prefill": worker.prefill}[command]
            conn.send(("ok", loop.run_until_complete(method(*args))))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
