"""bench/engine/offline.py's peer runs: a run's process group is gone before the next system
runs."""

from __future__ import annotations

import os
import subprocess

from bench.engine.offline import _reap_group


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_outlives_the_run_is_waited_for() -> None:
    """The script exits at once; its child (vLLM's engine core, in the real run) lives on
    for a second: the reaper returns only once it has gone."""
    proc = subprocess.Popen(["sh", "-c", "sleep 1 & exit 0"], start_new_session=True)
    proc.wait(timeout=10)
    assert _alive(proc.pid)
    _reap_group(proc.pid, wait_s=20)
    assert not _alive(proc.pid)


def test_a_child_that_will_not_end_is_killed_after_the_wait() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 600 & exit 0"], start_new_session=True)
    proc.wait(timeout=10)
    _reap_group(proc.pid, wait_s=0.5)
    assert not _alive(proc.pid)
