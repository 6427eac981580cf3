"""Every reader of a worker's event log gets every batch, in order, however many read it."""

from __future__ import annotations

from core.events import BlockStored, KVEventBatch
from worker.event_log import EventLog


def batch(seq: int) -> KVEventBatch:
    return KVEventBatch("w", seq, [BlockStored(None, [seq])])


def test_readers_each_get_every_batch_in_order() -> None:
    log = EventLog()
    for seq in range(3):
        log.append(batch(seq))
    first = log.since(-1)
    assert [b.seq for b in first] == [0, 1, 2]
    log.append(batch(3))
    assert [b.seq for b in log.since(2)] == [3]  # a reader that had up to 2
    assert [b.seq for b in log.since(-1)] == [0, 1, 2, 3]  # another, new reader: all of it
    assert log.since(3) == [] and log.since(9) == []


def test_a_reader_behind_the_retention_is_told_to_take_a_snapshot() -> None:
    log = EventLog(max_batches=3)
    for seq in range(5):
        log.append(batch(seq))
    assert [b.seq for b in log.since(1)] == [2, 3, 4]  # the oldest kept is 2
    assert log.since(0) is None and log.since(-1) is None
    assert EventLog().since(-1) == []
