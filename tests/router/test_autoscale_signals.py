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


def test_the_prefill_pool_is_charged_only_the_ttfts_of_prompts_it_computed() -> None:
    window = SloWindow()
    for ttft in (4.0, 5.0, 6.0):  # prompts the decode worker prefilled behind its batch
        window.add(ttft, None)
    assert window.prefill_pool_ttft() is None
    window.add(0.3, None, prefilled_by="prefill")
    window.add(0.2, None, prefilled_by="prefill")
    assert window.prefill_pool_ttft(0.9) == 0.3
    assert window.percentiles(0.9) == (6.0, None)
    report = door_report("door-1", window, {})
    assert (report.ttft_p90_s, report.prefill_ttft_p90_s) == (6.0, 0.3)


def test_busy_is_the_stepping_share_between_two_loads() -> None:
    collector = SignalCollector()
    assert collector.rates(load("d-0", "decode", 10.0, stepped_s=1.0)) == (0.0, 0.0)  # first
    # 1.5 s of steps (attention is inside forward, not added) in 2 s of wall time.
    busy, _ = collector.rates(load("d-0", "decode", 12.0, stepped_s=2.5))
    assert busy == pytest.approx(0.75)


def test_work_is_prompt_tokens_and_decode_rows_a_second_summed_over_the_pool() -> None:
    collector = SignalCollector()

    def worked(worker_id: str, at: float, prefill: int, rows: int) -> WorkerLoad:
        steps = StepTotals(prefill_tokens=prefill, decode_rows=rows)
        return WorkerLoad(worker_id, "unified", 0, 0, 0, 100, 100, timestamp=at, steps=steps)

    first = [("decode", worked("d-0", 10.0, 500, 40)), ("decode", worked("d-1", 10.0, 0, 0))]
    assert collector.pools({"decode": 2}, {}, first)["decode"].tokens_per_s == 0.0
    later = [("decode", worked("d-0", 12.0, 900, 240)), ("decode", worked("d-1", 12.0, 100, 0))]
    # (400 + 200) / 2 s and 100 / 2 s
    assert collector.pools({"decode": 2}, {}, later)["decode"].tokens_per_s == pytest.approx(350)


def test_pool_signals_merge_worker_loads_and_fresh_door_reports() -> None:
    collector = SignalCollector(stale_after_s=10.0)
    now = time.time()
    waiting = {"prefill": (3, 0.8), "decode": (1, 0.1)}
    collector.add_door(DoorReport("a", now, 1.2, 0.05, waiting, prefill_ttft_p90_s=0.9))
    collector.add_door(DoorReport("b", now, 2.5, 0.02, {"prefill": (1, 1.4)}, 1.1))
    collector.add_door(DoorReport("old", now - 60, 99.0, 99.0, {"prefill": (50, 99.0)}, 99.0))
    loads = [  # a decode worker's engine reports role `unified`: the pool is what counts
        ("prefill", load("p-0", "prefill", now, num_waiting=2, oldest_wait_s=0.3)),
        ("decode", load("d-0", "unified", now, num_free_blocks=20)),
        ("decode", load("d-1", "unified", now, num_free_blocks=60)),
    ]
    pools = collector.pools({"prefill": 2, "decode": 2}, {"prefill": 1}, loads)
    p, d = pools["prefill"], pools["decode"]
    assert (p.ready, p.starting, p.queued, p.oldest_wait_s) == (1, 1, 6, 1.4)
    # the slowest door, over the prompts the prefill pool computed; the stale one dropped
    assert (p.ttft_p90_s, p.itl_p90_s) == (1.1, None)
    assert (d.ready, d.queued, d.oldest_wait_s) == (2, 1, 0.1)
    assert (d.ttft_p90_s, d.itl_p90_s) == (None, 0.05)
    assert d.kv_usage == pytest.approx(0.6)
    assert "old" not in collector.doors
    unified = collector.pools({"unified": 1}, {}, [("unified", load("u-0", "unified", now))])
    assert unified["unified"].ttft_p90_s == 2.5  # it computes every prompt


def test_the_batch_growth_is_the_slope_of_its_usage_over_the_last_looks(monkeypatch) -> None:
    """Running requests 4, 8, 12 of a 40-slot cap at looks 1 s apart: 10% of the slots a
    second; only the last `TREND_LOOKS` looks count."""
    from router.cluster.autoscale import signals

    assert signals.slope([]) == 0.0 and signals.slope([(1.0, 0.5), (1.0, 0.7)]) == 0.0
    clock = [1000.0]
    monkeypatch.setattr(signals.time, "time", lambda: clock[0])
    collector = SignalCollector()
    growth = []
    for i, running in enumerate([*([0] * signals.TREND_LOOKS), 4, 8, 12]):
        clock[0] = 1000.0 + i
        busy = load("d-0", "unified", clock[0], num_running=running, max_num_seqs=40)
        growth.append(collector.pools({"decode": 1}, {}, [("decode", busy)])["decode"])
    assert growth[-1].batch_usage == pytest.approx(0.3)
    assert growth[signals.TREND_LOOKS - 1].batch_growth_per_s == 0.0
    # The last 8 looks: five at 0, then 0.1, 0.2, 0.3: least squares, not the last step.
    expected = signals.slope([(t, y) for t, y in enumerate([0, 0, 0, 0, 0, 0.1, 0.2, 0.3])])
    assert growth[-1].batch_growth_per_s == pytest.approx(expected)
    assert 0.03 < expected < 0.1


def test_a_door_report_reads_its_window_and_books() -> None:
    window = SloWindow()
    window.add(0.4, 0.03)
    books = {"prefill": WaitBook(), "decode": WaitBook()}
    with books["decode"].waiting():
        report = door_report("door-1", window, books)
    assert (report.door_id, report.ttft_p90_s, report.itl_p90_s) == ("door-1", 0.4, 0.03)
    assert report.waiting["prefill"] == (0, 0.0) and report.waiting["decode"][0] == 1
    assert door_report("door-2", None, {}).ttft_p90_s is None
