"""Hypothesis: the PrefixIndex against brute-force models.

1. Any in-order sequence of stored / removed / cleared events and queries gives the answers
   of a per-worker set of hashes walked block by block.
2. Over a lossy, duplicating channel with worker restarts and re-sync snapshots, the index
   never claims a block the worker does not hold (checked after every delivered batch) and
   is exact whenever no batch of the worker was lost since its start or last snapshot.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from core.hashing import hash_prompt_blocks, model_root_hash
from router.routing.index.prefix_index import PrefixIndex

ROOT = model_root_hash("prop", 1)
WORKERS = ["w0", "w1", "w2"]
# Prompts over a 3-symbol alphabet share prefixes often.
paths = st.lists(st.integers(0, 2), min_size=0, max_size=7)


def chain(path: list[int]) -> list[int]:
    return hash_prompt_blocks(path, 1, ROOT)


def brute_prefix(held: set[int], hashes: list[int]) -> int:
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def brute_answer(truth: dict[str, set[int]], hashes: list[int]) -> dict[str, int]:
    found = {w: brute_prefix(s, hashes) for w, s in truth.items()}
    return {w: n for w, n in found.items() if n}


stored = st.tuples(st.just("stored"), st.sampled_from(WORKERS), paths, st.integers(0, 7))
removed = st.tuples(st.just("removed"), st.sampled_from(WORKERS), paths, st.integers(0, 7))
cleared = st.tuples(st.just("cleared"), st.sampled_from(WORKERS), st.just([]), st.just(0))
query = st.tuples(st.just("query"), st.just(""), paths, st.just(0))
ops = st.lists(st.one_of(stored, removed, cleared, query), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_index_matches_brute_force(op_list) -> None:
    index = PrefixIndex("prop")
    truth: dict[str, set[int]] = {w: set() for w in WORKERS}
    seq = dict.fromkeys(WORKERS, 0)
    for kind, worker, path, start in op_list:
        hashes = chain(path)
        if kind == "query":
            assert index.longest_prefixes(hashes) == brute_answer(truth, hashes)
            continue
        if kind == "stored":
            part = hashes[start:]  # stored chains need not start at the root
            parent = hashes[start - 1] if 0 < start <= len(hashes) else None
            event = BlockStored(parent, part)
            truth[worker] |= set(part)
        elif kind == "removed":
            part = hashes[start:]
            event = BlockRemoved(part)
            truth[worker] -= set(part)
        else:
            event = AllBlocksCleared()
            truth[worker].clear()
        index.apply(KVEventBatch(worker, seq[worker], [event]))
        seq[worker] += 1
    probe = chain([0, 1, 2, 0, 1, 2, 0])
    assert index.longest_prefixes(probe) == brute_answer(truth, probe)
    assert index.num_entries == sum(len(s) for s in truth.values())
    assert index.num_hashes == len(set().union(*truth.values()))


channel_ops = st.lists(
    st.tuples(
        st.sampled_from(["event", "event", "event", "restart", "snapshot"]),
        st.sampled_from(WORKERS),
        st.sampled_from(["deliver", "deliver", "deliver", "drop", "duplicate"]),
        st.booleans(),
        paths,
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(channel_ops)
def test_index_converges_over_lossy_channel(op_list) -> None:
    index = PrefixIndex("prop")
    truth: dict[str, set[int]] = {w: set() for w in WORKERS}
    next_seq = dict.fromkeys(WORKERS, 0)
    exact = dict.fromkeys(WORKERS, True)  # no undelivered batch since start / snapshot
    for kind, worker, fate, store, path in op_list:
        hashes = chain(path)
        if kind == "restart":
            # The worker restarts empty and opens with a self-contained batch, not lost.
            truth[worker] = set()
            next_seq[worker] = 0
            events = [AllBlocksCleared(), BlockStored(None, hashes)]
            truth[worker] |= set(hashes)
            fate = "deliver"
            exact[worker] = True
        elif kind == "snapshot":
            events = [AllBlocksCleared(), BlockStored(None, sorted(truth[worker]))]
        elif store:
            events = [BlockStored(None, hashes)]
            truth[worker] |= set(hashes)
        else:
            events = [BlockRemoved(hashes)]
            truth[worker] -= set(hashes)
        b = KVEventBatch(worker, next_seq[worker], events)
        next_seq[worker] += 1
        if fate == "drop":
            exact[worker] = False
            continue
        index.apply(b)
        if fate == "duplicate":
            index.apply(b)
        if kind == "snapshot":
            exact[worker] = True
        view = index.worker_blocks(worker)
        assert view <= truth[worker], "index claims blocks the worker does not hold"
        if exact[worker]:
            assert view == truth[worker]
            assert worker not in index.stale_workers
    # After a snapshot of every worker, the index is the truth.
    for w in WORKERS:
        snap = [AllBlocksCleared(), BlockStored(None, sorted(truth[w]))]
        index.apply(KVEventBatch(w, next_seq[w], snap))
        assert index.worker_blocks(w) == truth[w]
    assert not index.stale_workers
