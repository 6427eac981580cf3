"""Which processes share a host, for the KV transport: the same kernel (boot id), the same
pid namespace (so one can open the other's file descriptors through /proc) and the same
network namespace (so one can reach the other's abstract Unix sockets). Two containers on one
machine, or two network namespaces standing in for two hosts in the tests, are different
hosts by this measure, and that is what the `shm` backend needs."""

from __future__ import annotations

import functools
import os
from pathlib import Path


@functools.cache
def host_identity() -> str:
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return "|".join([boot_id, os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/net")])
