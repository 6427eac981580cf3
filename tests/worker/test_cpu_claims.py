"""A CPU worker's compute threads, bound a CPU each (worker/cpu_claims.py, worker/threads.py
`bind_team`): the CPUs fewest live processes of the host claim first, a dead process's
claims dropped, siblings of a claimed core after free cores, threads that outnumber the
CPUs spread evenly; and a real OpenMP team bound thread by thread (in a process of its
own: the test process's threads stay unbound)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import cpu_kernels
from worker import cpu_claims
from worker.cpu_claims import claim_cpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def four_cpus(monkeypatch):
    """CPUs 0-3: 0 and 1 share one physical core, 2 and 3 another."""
    monkeypatch.setattr(cpu_claims.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpu_claims, "_core_of", lambda cpu: (0, cpu // 2))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_worker_takes_the_cpus_no_live_worker_holds(tmp_path, four_cpus) -> None:
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"1": [0], str(dead_pid()): [2, 3]}))  # PID 1 lives
    assert claim_cpus(1, claims) == [2]  # not 0 (held), nor 1 (0's core): 2, the dead's
    held = json.loads(claims.read_text())
    assert held == {"1": [0], str(os.getpid()): [2]}  # the dead claim is gone
    assert claim_cpus(2, claims) == [2, 1]  # a second claim replaces this process's first
    assert json.loads(claims.read_text())[str(os.getpid())] == [2, 1]


def test_free_cores_before_a_claimed_core_s_sibling(tmp_path, four_cpus) -> None:
    assert claim_cpus(2, tmp_path / "c.json") == [0, 2]


def test_threads_that_outnumber_the_cpus_spread_evenly(tmp_path, four_cpus) -> None:
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"1": [0, 1, 2]}))
    assert sorted(claim_cpus(5, claims)) == [0, 1, 2, 3, 3]


def test_an_unreadable_claims_file_starts_again(tmp_path, four_cpus) -> None:
    claims = tmp_path / "claims.json"
    claims.write_text("{not json")
    assert claim_cpus(1, claims) == [0]
    with pytest.raises(ValueError, match="count"):
        claim_cpus(0, claims)


def test_two_worker_processes_take_different_cpus(tmp_path) -> None:
    """Real processes, the machine's own CPUs: the first holds its claim while alive."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    claims = tmp_path / "claims.json"
    script = (
        "import sys; from pathlib import Path; from worker.cpu_claims import claim_cpus; "
        "print(claim_cpus(1, Path(sys.argv[1]))[0], flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-c", script, str(claims)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        cpu_first = int(first.stdout.readline())  # type: ignore[union-attr]
        second = subprocess.run(
            [sys.executable, "-c", script, str(claims)], input="", capture_output=True,
            text=True, env=env, timeout=60, check=True,
        )  # fmt: skip
        assert int(second.stdout) != cpu_first
    finally:
        first.communicate("", timeout=60)


_BIND = textwrap.dedent(
    """
    import json, os, sys, threading
    from pathlib import Path
    import torch
    from engine import cpu_kernels
    from worker import cpu_claims, threads

    threads.claim_cpus = lambda n: cpu_claims.claim_cpus(n, Path(sys.argv[1]))
    got = {}

    def engine_thread():  # as in a worker: the engine steps on a thread of its own
        torch.set_num_threads(2)
        torch.ones(1 << 16).mul_(2)  # a parallel region: the team exists
        got["cpus"] = threads.bind_team()
        got["team"] = team = cpu_kernels.load("thread_team").team_thread_ids()
        got["bound"] = {t: sorted(os.sched_getaffinity(t)) for t in team}  # while it lives
        got["main"] = sorted(os.sched_getaffinity(os.getpid()))

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    print(json.dumps(got))
    """
)


def test_bind_team_binds_each_team_thread_to_its_claimed_cpu(tmp_path) -> None:
    if cpu_kernels.load("thread_team") is None:
        pytest.skip("thread_team kernel not built")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    claims = tmp_path / "claims.json"
    out = subprocess.run(
        [sys.executable, "-c", _BIND, str(claims)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["team"]) == 2 and len(set(got["cpus"])) == 2
    for tid, cpu in zip(got["team"], got["cpus"]):
        assert got["bound"][str(tid)] == [cpu]
    assert got["main"] == sorted(os.sched_getaffinity(0))  # other threads stay unbound


def test_the_serve_flag_binds_by_default() -> None:
    import argparse

    from router.cli.serve_args import add_serve_arguments

    p = argparse.ArgumentParser(prog="baton serve")
    add_serve_arguments(p)
    assert p.parse_args([]).cpu_bind is True
    assert p.parse_args(["--no-cpu-bind"]).cpu_bind is False
