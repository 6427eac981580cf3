"""How a worker's compute threads run on the machine's cores: a fixed, small number, so the
workers of one machine share its cores instead of each spawning one thread per core; each
bound to a CPU of its own (`bind_team`, unless `baton serve --no-cpu-bind`); and, on
request (`baton serve --engine-nice`), ahead of the threads that only move bytes.

Why ahead: every parallel region ends in a barrier, so a thread that preempts one compute
thread stalls the whole team for as long. Served on 2 cores (small preset, bf16, 4 tenants'
1,024-token system prompts), the front door, the load client and the worker's own I/O took
~30% of a core, and the engine's forward step read 75 ms against 46 offline (offline with a
process burning 20% of a core beside it: 57). Ahead of the others, the compute threads run
their regions through and the rest runs in their gaps: windows alternating in one served run
at 12 req/s, those two threads at Ray's nice 15 against -10, forward 75.4 -> 65.9 ms a step,
decode rows 700 -> 828 a second.
The price is the front door's wait for those gaps: at 8 req/s (under saturation) TTFT mean
135 -> 274-301 ms for TPOT p50 47 -> 40 ms (bench/results/serving/
peer_bf16_shared_prefix_xeon_amx.json has the sweep against vLLM). So it is off by default:
worth it where tokens per second count more than the first token's wait (batch work on a node
that also runs its front door). At -5 nothing changed (the others still preempt at once); at -20 the
front door starved (a /metrics read timed out after 5 s)."""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from engine import cpu_kernels
from worker.cpu_claims import claim_cpus

logger = logging.getLogger(__name__)

IO_ABOVE_ENGINE = 10
"""The worker's other threads (its Ray calls, its event loop, the KV transport's I/O) get the
compute threads' nice plus this (0, the front door's level, for -10). Left at Ray's 15
under compute threads at -10 (a weight 265 times theirs) they starved: outputs waited in the
worker, a stream's p99 gap between tokens rose from ~0.25 to 0.76 s. At the compute threads'
own value instead, TTFT was no better (246-279 ms mean at 8 req/s against 274-301)."""


def pin_threads(num_threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)


def raise_team_priority(nice: int | None) -> None:
    """Give the calling thread's OpenMP team (it and the workers its regions run on) `nice`
    and the process's other threads `nice + IO_ABOVE_ENGINE`; None leaves them as they are.
    Call it on the thread that steps the engine, once the engine and its I/O threads exist
    (threads the engine thread starts later inherit its value).
    Refused (a value below the threads' own without CAP_SYS_NICE, which root has and a pod
    gets from `securityContext: {capabilities: {add: [SYS_NICE]}}`), every thread keeps its
    priority, with a warning; where the compute threads' value is allowed, the others'
    (higher) is too."""
    if nice is None:
        return
    team = cpu_kernels.load("thread_team")
    if team is None:
        logger.warning("engine threads keep their priority: the thread_team kernel is unbuilt")
        return
    results = team.set_team_nice(nice)
    refused = {err for _, err in results if err}
    if refused:  # e.g. below 0 without CAP_SYS_NICE: leave every thread as it was
        reasons = ", ".join(sorted(os.strerror(err) for err in refused))
        logger.warning(
            "engine threads keep their priority (nice %d refused: %s); grant CAP_SYS_NICE, "
            "or pass --engine-nice none to keep Ray's",
            nice, reasons,
        )  # fmt: skip
        return
    compute = {tid for tid, _ in results}
    for tid in map(int, os.listdir("/proc/self/task")):  # Ray starts them at 15
        if tid not in compute:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + IO_ABOVE_ENGINE))
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
            except OSError as e:
                logger.warning("worker thread %d keeps its priority: %s", tid, e)


def bind_team(enabled: bool = True) -> list[int]:
    """Bind each thread of the calling thread's OpenMP team to its own CPU, claimed among
    this host's workers (worker/cpu_claims.py, which says why); returns the CPUs, in team
    order (the caller's first), or [] where nothing was bound. Call it on the thread that
    steps the engine, once its I/O threads exist: threads it starts later inherit its CPU.
    A refusal (no claims file, a CPU the process may no longer use) leaves every thread
    unbound, with a warning."""
    if not enabled:
        return []
    team = cpu_kernels.load("thread_team")
    if team is None:
        logger.warning("engine threads left unbound: the thread_team kernel is unbuilt")
        return []
    tids = team.team_thread_ids()
    allowed = os.sched_getaffinity(os.getpid())
    try:
        cpus = claim_cpus(len(tids))
        for tid, cpu in zip(tids, cpus):
            os.sched_setaffinity(tid, {cpu})
    except OSError as e:
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, allowed)
        logger.warning("engine threads left unbound: %s", e)
        return []
    logger.info("engine threads %s bound to CPUs %s", tids, cpus)
    return cpus
