"""Which CPUs a CPU worker binds its engine's compute threads to, one each.

Why bind: where a host's compute threads outnumber its cores, the kernel's placement
can put two threads of one team on one core, and every parallel region waits at its
barrier for the last of them. Two unified workers of two threads each on two cores (small
preset, bf16, the fixed 256 -> 64 workload at 16 req/s): 3.81 / 4.29 / 4.91 req/s free
against 6.25 / 5.70 / 6.45 bound. One such worker alone: bound ahead in 9 of 14 alternating
pairs, +5.8% on average, within that machine's noise.
`vllm serve` binds its OpenMP threads the same way (VLLM_CPU_OMP_THREADS_BIND).

Why claims: the workers of one host all see the same CPUs allowed (Ray starts its workers
unbound), so each binding its thread i to the i-th allowed CPU would stack every worker's
first thread on one CPU. A worker instead claims the CPUs fewest live workers hold, under
an exclusive lock on a small JSON file in /dev/shm that every worker process of the host
sees (a pod has its own /dev/shm and its own cpuset, and claims within them). A claim lives
as long as its process: a dead PID's claims are dropped at the next claim. Where the threads
outnumber the CPUs (more workers than cores) they spread evenly, never stacked on one CPU
while another has fewer. Logical CPUs that share a physical core come after those that do
not, so two compute threads do not split one core while another core idles.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import Counter
from pathlib import Path

CLAIMS_FILE = Path("/dev/shm/baton-cpu-claims.json")


def claim_cpus(count: int, path: Path = CLAIMS_FILE) -> list[int]:
    """`count` CPUs of this process's allowed set (repeating some where it has fewer), the
    least claimed by live processes first, recorded as this process's claim (any earlier
    claim of its own replaced)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    # the main thread's CPUs: an engine thread bound already would give its one CPU
    allowed = sorted(os.sched_getaffinity(os.getpid()))
    me = str(os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        f.seek(0)
        claims = {pid: cpus for pid, cpus in _read(f.read()).items() if pid != me and _alive(pid)}
        held = Counter(cpu for cpus in claims.values() for cpu in cpus)
        core = {cpu: _core_of(cpu) for cpu in allowed}
        chosen: list[int] = []
        for _ in range(count):
            on_core = Counter(core[c] for c in held.elements() if c in core)
            best = min(allowed, key=lambda c: (held[c], on_core[core[c]], c))
            chosen.append(best)
            held[best] += 1
        claims[me] = chosen
        f.seek(0)
        f.truncate()
        f.write(json.dumps(claims))
    return chosen


def _read(text: str) -> dict[str, list[int]]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:  # a file another version wrote, or cut short: start again
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): [int(c) for c in v] for k, v in data.items() if isinstance(v, list)}


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _core_of(cpu: int) -> tuple[int, int] | int:
    """The physical core a logical CPU is on ((package, core) from sysfs; the CPU itself
    where sysfs does not say)."""
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        package = int((base / "physical_package_id").read_text())
        return (package, int((base / "core_id").read_text()))
    except (OSError, ValueError):
        return cpu
