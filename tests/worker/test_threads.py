"""A CPU worker's compute threads ahead of its I/O threads (worker/threads.py): the engine
thread's OpenMP team gets the nice value, the process's other threads that plus
IO_ABOVE_ENGINE; refused without the privilege, every thread as it was and a warning. Each
case runs in a process of its own: the test process's priorities stay untouched."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import cpu_kernels
from worker.threads import IO_ABOVE_ENGINE

ROOT = Path(__file__).resolve().parents[2]

_CASE = textwrap.dedent(
    """
    import json, os, sys, threading
    import torch
    from engine import cpu_kernels
    from worker.threads import raise_team_priority

    torch.set_num_threads(2)
    torch.ones(1 << 16).mul_(2)  # a parallel region: the team exists
    stop = threading.Event()
    io = threading.Thread(target=stop.wait, name="io")  # stands for Ray's and the KV's I/O
    io.start()
    cpu_kernels.load("thread_team")  # loaded (cached) while the build cache is readable
    if sys.argv[2] == "drop":
        os.setuid(65534)  # nobody: no CAP_SYS_NICE
    raise_team_priority(int(sys.argv[1]))
    team = cpu_kernels.load("thread_team").team_thread_ids()
    nice = {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
    print(json.dumps({"pid": os.getpid(), "team": team, "io": io.native_id, "nice": nice}))
    stop.set()
    """
)


def _run(nice: int, privilege: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CASE, str(nice), privilege],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["nice"] = {int(k): v for k, v in out["nice"].items()}
    return out, proc.stderr


needs_kernel = pytest.mark.skipif(
    cpu_kernels.load("thread_team") is None, reason="the thread_team kernel does not build here"
)


@needs_kernel
def test_the_team_gets_the_value_and_the_other_threads_run_behind_it() -> None:
    # A value above the process's own needs no privilege: the same path as -10 under root.
    out, _ = _run(4, "keep")
    team, nice = out["team"], out["nice"]
    assert len(set(team)) == 2 and team[0] == out["pid"]  # the caller (main thread) leads
    assert all(nice[t] == 4 for t in team)
    assert nice[out["io"]] == 4 + IO_ABOVE_ENGINE
    assert all(v == 4 + IO_ABOVE_ENGINE for t, v in nice.items() if t not in team)


@needs_kernel
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the privilege needs root to start")
def test_without_the_privilege_every_thread_keeps_its_priority_and_it_says_so() -> None:
    out, stderr = _run(-5, "drop")
    assert set(out["nice"].values()) == {0}
    assert "nice -5 refused" in stderr and "CAP_SYS_NICE" in stderr


def test_the_serve_flag_is_off_by_default_and_takes_a_nice_value(capsys) -> None:
    from router.cli.serve_args import add_serve_arguments

    p = argparse.ArgumentParser(prog="baton serve")
    add_serve_arguments(p)
    assert p.parse_args([]).engine_nice is None
    assert p.parse_args(["--engine-nice", "none"]).engine_nice is None
    assert p.parse_args(["--engine-nice", "-10"]).engine_nice == -10
    for bad in ("-21", "20", "high"):
        with pytest.raises(SystemExit):
            p.parse_args(["--engine-nice", bad])
        assert "--engine-nice: a nice value from -20 to 19, or none" in capsys.readouterr().err
