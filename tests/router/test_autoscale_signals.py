"""What the autoscaler reads: the doors' wait books and latency windows, and the pools'
signals from worker loads (router/cluster/autoscale/signals.py, router/frontdoor/slo_window.py)."""

from __future__ import annotations

import time

import pytest

from core.events import WorkerLoad
from core.step_stats import StepTotals
from router.cluster.autoscale.signals import DoorReport, SignalCollector, WaitBook, door_report
from router.frontdoor.slo_window import SloWindow


def load(worker_id: str, role: str, at: float, stepped_s: float = 0.0, **kw) -> WorkerLoad:
    fields = {"num_running": 0, "num_waiting": 0, "num_waiting_tokens": 0,
              "num_free_blocks": 100, "num_total_blocks": 100} | kw  # fmt: skip
    steps = StepTotals(forward_s=stepped_s * 0.8, sample_s=stepped_s * 0.2, attention_s=9.0)
    return WorkerLoad(worker_id, role, timestamp=at, steps=steps, **fields)


def test_the_wait_book_counts_waiters_and_the_oldest_wait() -> None:
    book = WaitBook()
    assert book.stats() == (0, 0.0)
    with book.waiting():
        time.sleep(0.05)
        with book.waiting():
            n, oldest = book.stats()
            assert n == 2 and oldest >= 0.05
    assert book.stats() == (0, 0.0)
    with pytest.raises(RuntimeError), book.waiting():
        raise RuntimeError("a failed wait still leaves the book")
    assert book.stats() == (0, 0.0)


def test_the_latency_window_forgets_old_samples() -> None:
    now = [100.0]
    window = SloWindow(window_s=30.0, clock=lambda: now[0])
    assert window.percentiles() == (None, None)
    for i in range(10):
        window.add(ttft_s=float(i), itl_s=None)
    window.add(ttft_s=None, itl_s=0.05)
    assert window.percentiles(0.9) == (9.0, 0.05)
    assert window.percentiles(0.5) == (5.0, 0.05)
    now[0] = 131.0
    window.add(ttft_s=0.5, itl_s=None)
    assert window.percentiles(0.9) == (0.5, None)


def test_busy_is_the_stepping_share_between_two_loads() -> None:
    collector = SignalCollector()
    assert collector.busy(load("d-0", "decode", 10.0, stepped_s=1.0)) == 0.0  # first read
    # 1.5 s of steps (attention is inside forward, not added) in 2 s of wall time.
    assert collector.busy(load("d-0", "decode", 12.0, stepped_s=2.5)) == pytest.approx(0.75)


def test_pool_signals_merge_worker_loads_and_fresh_door_reports() -> None:
    collector = SignalCollector(stale_after_s=10.0)
    now = time.time()
    collector.add_door(DoorReport("a", now, 1.2, 0.05, {"prefill": (3, 0.8), "decode": (1, 0.1)}))
    collector.add_door(DoorReport("b", now, 2.5, 0.02, {"prefill": (1, 1.4)}))
    collector.add_door(DoorReport("old", now - 60, 99.0, 99.0, {"prefill": (50, 99.0)}))
    loads = [  # a decode worker's engine reports role `unified`: the pool is what counts
        ("prefill", load("p-0", "prefill", now, num_waiting=2, oldest_wait_s=0.3)),
        ("decode", load("d-0", "unified", now, num_free_blocks=20)),
        ("decode", load("d-1", "unified", now, num_free_blocks=60)),
    ]
    pools = collector.pools({"prefill": 2, "decode": 2}, {"prefill": 1}, loads)
    p, d = pools["prefill"], pools["decode"]
    assert (p.ready, p.starting, p.queued, p.oldest_wait_s) == (1, 1, 6, 1.4)
    assert (p.ttft_p90_s, p.itl_p90_s) == (2.5, None)  # the slowest door; stale one dropped
    assert (d.ready, d.queued, d.oldest_wait_s) == (2, 1, 0.1)
    assert (d.ttft_p90_s, d.itl_p90_s) == (None, 0.05)
    assert d.kv_usage == pytest.approx(0.6)
    assert "old" not in collector.doors


def test_a_door_report_reads_its_window_and_books() -> None:
    window = SloWindow()
    window.add(0.4, 0.03)
    books = {"prefill": WaitBook(), "decode": WaitBook()}
    with books["decode"].waiting():
        report = door_report("door-1", window, books)
    assert (report.door_id, report.ttft_p90_s, report.itl_p90_s) == ("door-1", 0.4, 0.03)
    assert report.waiting["prefill"] == (0, 0.0) and report.waiting["decode"][0] == 1
    assert door_report("door-2", None, {}).ttft_p90_s is None
