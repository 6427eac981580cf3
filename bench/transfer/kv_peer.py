"""One side of a KV transfer benchmark pair (bench/transfer/kv_transfer.py `child`) as a process of
its own, reached over a Unix socket, so it can run on another host of a network-namespace
bed (bench/transfer/hosts.py): a Unix socket is a file, which every namespace of the bed sees.

    python -m bench.transfer.kv_peer SOCKET SIDE '<json: backend, tls, spec_kwargs, cpu, loopback>'

The socket's key comes in BATON_BENCH_KEY (hex)."""

from __future__ import annotations

import json
import os
import sys
from multiprocessing.connection import Client

from bench.transfer.kv_transfer import child


def main() -> None:
    socket_path, side, arguments = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    key = bytes.fromhex(os.environ["BATON_BENCH_KEY"])
    conn = Client(socket_path, family="AF_UNIX", authkey=key)
    conn.send(side)  # which side this connection is: they may connect in any order
    child(conn, **arguments)


if __name__ == "__main__":
    main()
