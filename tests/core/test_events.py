from core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WorkerLoad,
    decode_event_batch,
    decode_worker_load,
    encode,
)
from core.hashing import BlockHash


def test_event_batch_roundtrip() -> None:
    batch = KVEventBatch(
        worker_id="w1",
        seq=7,
        events=[
            BlockStored(parent=None, block_hashes=[BlockHash(1), BlockHash(2)]),
            BlockStored(parent=BlockHash(2), block_hashes=[BlockHash(2**64 - 1)]),
            BlockRemoved(block_hashes=[BlockHash(1)]),
            AllBlocksCleared(),
        ],
        timestamp=1.5,
        model="m",
    )
    assert decode_event_batch(encode(batch)) == batch


def test_worker_load_roundtrip() -> None:
    load = WorkerLoad("w", "decode", 3, 1, 100, 50, 64, 2.0)
    assert decode_worker_load(encode(load)) == load
