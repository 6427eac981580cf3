"""A load report that reaches the router after the reply of a prefill it still counts must
not bring that prefill back as queued work (router.routing.load)."""

from __future__ import annotations

from core.events import WorkerLoad
from core.step_stats import StepTotals
from router.routing.load import LoadTracker
from router.routing.worker_state import prefill_load


def report(tracker: LoadTracker, waiting_tokens: int, step: int) -> None:
    load = WorkerLoad("p0", "prefill", 0, 1, waiting_tokens, 10, 20, steps=StepTotals(step))
    tracker.report(load)


def routed(tracker: LoadTracker, tokens: int):
    p, d = tracker.workers["p0"], tracker.workers["d0"]
    charge = tracker.start(p, tokens, d, 1)
    tracker.admit(charge)
    return charge


def tracker_with_workers() -> LoadTracker:
    tracker = LoadTracker()
    tracker.add_worker("p0", "prefill", "m")
    tracker.add_worker("d0", "decode", "m")
    return tracker


def test_a_report_taken_before_the_prefill_ended_but_read_after_it_does_not_count_it() -> None:
    tracker = tracker_with_workers()
    p0 = tracker.workers["p0"]
    report(tracker, 0, step=4)
    charge = routed(tracker, 276)
    assert prefill_load(p0) == 276
    # The worker got it after 4 steps and prefilled it in its 5th; the router reads that
    # reply first, then a report the worker took after 4 steps, with the request waiting.
    tracker.prefill_done(charge, (4, 5, 276))
    assert prefill_load(p0) == 0
    report(tracker, 276 + 100, step=4)  # 100 tokens of someone else's request wait too
    assert prefill_load(p0) == 100
    report(tracker, 100, step=5)  # a report taken after the prefill: nothing to correct
    assert prefill_load(p0) == 100
    assert p0.prefilled == []


def test_the_report_already_read_is_corrected_when_the_prefill_ends() -> None:
    tracker = tracker_with_workers()
    p0 = tracker.workers["p0"]
    charge = routed(tracker, 50)
    report(tracker, 50, step=7)  # the worker took it after 6 steps; it still waits
    assert prefill_load(p0) == 50
    tracker.prefill_done(charge, (6, 9, 50))
    assert prefill_load(p0) == 0


def test_a_prefill_that_arrived_after_the_report_was_taken_is_not_taken_out_of_it() -> None:
    tracker = tracker_with_workers()
    p0 = tracker.workers["p0"]
    report(tracker, 30, step=3)  # 30 tokens of another front door's request
    charge = routed(tracker, 40)
    tracker.prefill_done(charge, (5, 6, 40))  # it reached the worker after step 5
    assert prefill_load(p0) == 30
    report(tracker, 30, step=4)  # late, and taken before it arrived
    assert prefill_load(p0) == 30


def test_a_restarted_worker_forgets_its_old_prefills() -> None:
    tracker = tracker_with_workers()
    p0 = tracker.workers["p0"]
    report(tracker, 0, step=10)
    tracker.prefill_done(routed(tracker, 20), (10, 12, 20))
    report(tracker, 20, step=1)  # its step count went back: a new engine
    assert prefill_load(p0) == 20
    assert p0.prefilled == []
