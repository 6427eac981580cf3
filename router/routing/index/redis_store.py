"""The Redis index store: several router replicas share one view of the workers' caches.

Keys (prefix `ns`, default "baton:kv"):
    ns:stream                 stream of entries {m: model, w: worker, k: b|x|p, d: msgpack}
    ns:models                 set of model names
    ns:{model}:workers        set of worker ids
    ns:{model}:seq            hash worker -> last seq
    ns:{model}:w:{worker}     set of the worker's block hashes (8 bytes, big endian)
    ns:{model}:t:{worker}     hash: those it holds only in an offload tier -> the tier
    ns:{model}:stale          set of workers awaiting a re-sync snapshot

Write path (`publish`, any replica): the batch goes into a bounded queue; a publisher thread
drains it in pipelines of Lua calls. One Lua call applies the sequence rule of
prefix_index.py to the worker's set (purge on gap / restart, skip duplicates), applies
the events to the set, and XADDs the batch, atomically. So the sets are always the
materialised stream, and a snapshot of the sets plus the stream's last id is a consistent cut.
A routing decision's promise (pending.py: blocks sent to a worker for prefill, not reported
yet, or a new lifetime for one) is a plain XADD of kind p, {r: replica, t: seconds, n:
renew, d: msgpack hashes}: every other replica counts it from when it reads it. It is in no
set: it lives as long as its request waits, and a restarted replica that misses it routes
as it did before promises existed. A charge's prefill stage (router.routing.load_share) is
likewise an XADD of kind l, {r: replica, d: msgpack LoadShare}, handed to on_load_share;
after a snapshot load (start, outage) the ledger forgets the other replicas' charges heard
before, whose ends the outage may have dropped.

Read path (every replica): a consumer thread XREADs the stream from its last id and applies
each batch to the local PrefixIndex (same rule, same order, same result). `route` only reads
the local index: no Redis I/O on the decision path.

Restart: the consumer loads the snapshot (sets, seqs, last stream id, in one MULTI under
WATCH) and tails the stream from there; no worker is asked for anything.

Redis unreachable: the consumer logs one warning, `healthy` turns False (the Router then
routes by load alone), publishes are dropped and counted (the next batch of each worker shows
a seq gap, which the Lua rule turns into a purge + re-sync request). When Redis answers
again, the consumer reloads the snapshot, logs the recovery and `healthy` turns True.
Re-sync requests (`on_resync`) come from the publishing replica only, so each gap is
requested once cluster-wide.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
import redis

from core.events import (
    AllBlocksCleared,
    KVEventBatch,
    decode_event_batch,
    encode,
)
from router.routing.index.prefix_index import ApplyOutcome, PrefixIndex
from router.routing.index.redis_lua import PUBLISH_LUA, REMOVE_LUA, event_args
from router.routing.index.store import IndexStore, ResyncCallback
from router.routing.load_share import LoadShare

logger = logging.getLogger(__name__)

_REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)
_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE_HASHES = msgspec.msgpack.Decoder(list[int]).decode
_DECODE_SHARE = msgspec.msgpack.Decoder(LoadShare).decode


class RedisStore(IndexStore):
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        namespace: str = "baton:kv",
        on_resync: ResyncCallback | None = None,
        max_queue: int = 10_000,
        pipeline_size: int = 128,
        stream_maxlen: int = 1_000_000,
        poll_ms: int = 50,
        retry_s: float = 0.2,
    ) -> None:
        super().__init__(on_resync)
        self.namespace = namespace
        self._client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self._publish_lua = self._client.register_script(PUBLISH_LUA)
        self._remove_lua = self._client.register_script(REMOVE_LUA)
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(max_queue)
        self._pipeline_size = pipeline_size
        self._maxlen = stream_maxlen
        self._poll_ms = poll_ms
        self._retry_s = retry_s
        self._last_id = b"0-0"
        self._replica = uuid.uuid4().hex[:12].encode()  # our promises come back: skip them
        self._healthy = False
        self._need_load = True
        self._down_since: float | None = None  # set while Redis is unreachable
        self._stop = threading.Event()
        self._unfinished = 0  # queued + in-flight publishes, for sync()
        self._cv = threading.Condition()
        self._threads = [
            threading.Thread(target=self._consume_loop, name="kv-redis-consumer", daemon=True),
            threading.Thread(target=self._publish_loop, name="kv-redis-publisher", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ---- keys ----------------------------------------------------------------------------

    def _k(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    @property
    def healthy(self) -> bool:
        return self._healthy

    # ---- write path ----------------------------------------------------------------------

    def publish(self, batch: KVEventBatch) -> None:
        self._enqueue(("b", batch))

    def remove_worker(self, model: str, worker_id: str) -> None:
        with self._lock:  # leave the local view at once, the stream tells the other replicas
            self._forget(model, worker_id)
        self._enqueue(("x", (model, worker_id)))

    def promise(
        self,
        model: str,
        worker_id: str,
        hashes: Sequence[int],
        ttl_s: float,
        renew: bool = False,
    ) -> None:
        super().promise(model, worker_id, hashes, ttl_s, renew)
        if hashes:
            self._enqueue(("p", (model, worker_id, list(hashes), ttl_s, renew)))

    shares_load = True

    def share_load(self, share: LoadShare) -> None:
        self._enqueue(("l", share))

    def _enqueue(self, item: tuple[str, Any]) -> None:
        with self._cv:
            self._unfinished += 1
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._done(1)
            logger.warning("kv redis store: publish queue full, batch dropped (seq gap follows)")

    def _done(self, n: int) -> None:
        with self._cv:
            self._unfinished -= n
            self._cv.notify_all()

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            try:
                items = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(items) < self._pipeline_size:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._publish_many(items)
            except _REDIS_DOWN as exc:
                logger.debug("kv redis store: %d publishes dropped: %s", len(items), exc)
            except Exception:
                logger.exception("kv redis store: publish failed")
            finally:
                self._done(len(items))

    def _publish_many(self, items: list[tuple[str, Any]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        stream = self._k("stream")
        for kind, item in items:
            if kind == "b":
                b: KVEventBatch = item
                sc = bool(b.events) and isinstance(b.events[0], AllBlocksCleared)
                keys = [
                    stream,
                    self._k("models"),
                    self._k(b.model, "workers"),
                    self._k(b.model, "seq"),
                    self._k(b.model, "w", b.worker_id),
                    self._k(b.model, "stale"),
                    self._k(b.model, "t", b.worker_id),
                ]
                args = [
                    b.model,
                    b.worker_id,
                    b.seq,
                    encode(b),
                    self._maxlen,
                    int(sc),
                    *event_args(b),
                ]
                self._publish_lua(keys=keys, args=args, client=pipe)
            elif kind == "p":
                model, worker, hashes, ttl_s, renew = item
                fields = {"m": model, "w": worker, "k": "p", "r": self._replica,
                          "t": repr(ttl_s), "n": int(renew), "d": _ENCODE(hashes)}  # fmt: skip
                pipe.xadd(stream, fields, maxlen=self._maxlen, approximate=True)
            elif kind == "l":
                fields = {"m": "", "k": "l", "r": self._replica, "d": _ENCODE(item)}
                pipe.xadd(stream, fields, maxlen=self._maxlen, approximate=True)
            else:
                model, worker = item
                keys = [
                    stream,
                    self._k(model, "workers"),
                    self._k(model, "seq"),
                    self._k(model, "w", worker),
                    self._k(model, "stale"),
                    self._k(model, "t", worker),
                ]
                self._remove_lua(keys=keys, args=[model, worker, self._maxlen], client=pipe)
        results = pipe.execute()
        for (kind, item), res in zip(items, results):
            if kind == "b":
                outcome = ApplyOutcome(res.decode() if isinstance(res, bytes) else res)
                self._report(item.model, item.worker_id, outcome)

    # ---- read path -----------------------------------------------------------------------

    def _consume_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._need_load:
                    self._load_snapshot()
                    self._need_load = False
                    if self._on_load_share is not None:  # shares may be lost: start again
                        self._on_load_share([], True)
                    if self._down_since is not None:
                        logger.warning(
                            "kv redis store: Redis back after %.1f s, view rebuilt: "
                            "prefix-aware routing resumed",
                            time.monotonic() - self._down_since,
                        )
                        self._down_since = None
                    self._healthy = True
                resp = self._client.xread(
                    {self._k("stream"): self._last_id}, count=1000, block=self._poll_ms
                )
                for _stream, entries in resp or ():
                    self._apply_entries(entries)
            except _REDIS_DOWN as exc:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    logger.warning(
                        "kv redis store: Redis unreachable (%s): routing by load alone "
                        "until it returns",
                        exc,
                    )
                self._healthy = False
                self._need_load = True
                self._stop.wait(self._retry_s)
            except Exception:
                logger.exception("kv redis store: consumer error; reloading the snapshot")
                self._healthy = False
                self._need_load = True
                self._stop.wait(self._retry_s)

    def _apply_entries(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        if not entries:
            return
        shares: list[tuple[bytes, LoadShare]] = []
        with self._lock:
            for _, fields in entries:
                model, kind = fields[b"m"].decode(), fields[b"k"]
                if kind == b"l":
                    replica = fields[b"r"]
                    if replica != self._replica:
                        shares.append((replica, _DECODE_SHARE(fields[b"d"])))
                elif kind == b"x":
                    self._forget(model, fields[b"w"].decode())
                elif kind == b"p":
                    if fields[b"r"] != self._replica:
                        hashes = _DECODE_HASHES(fields[b"d"])
                        ttl_s, renew = float(fields[b"t"]), fields[b"n"] == b"1"
                        self._promise(model, fields[b"w"].decode(), hashes, ttl_s, renew)
                else:
                    batch = decode_event_batch(fields[b"d"])
                    self._applied(batch, self._index(model).apply(batch))
        if shares and self._on_load_share is not None:
            self._on_load_share(shares, False)  # outside our lock: the router takes its own
        self._last_id = entries[-1][0]  # sync() returns once the shares are applied too

    def _load_snapshot(self) -> None:
        """Rebuild the local view from the sets: one consistent cut under WATCH/MULTI."""
        with self._client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self._k("models"))
                    models = sorted(m.decode() for m in pipe.smembers(self._k("models")))
                    workers: dict[str, list[str]] = {}
                    for m in models:
                        key = self._k(m, "workers")
                        pipe.watch(key)
                        workers[m] = sorted(w.decode() for w in pipe.smembers(key))
                    pipe.multi()
                    pipe.xrevrange(self._k("stream"), count=1)
                    for m in models:
                        pipe.hgetall(self._k(m, "seq"))
                        pipe.smembers(self._k(m, "stale"))
                        for w in workers[m]:
                            pipe.smembers(self._k(m, "w", w))
                            pipe.hgetall(self._k(m, "t", w))
                    results = iter(pipe.execute())
                    break
                except redis.WatchError:
                    continue
        last = next(results)
        indexes: dict[str, PrefixIndex] = {}
        for m in models:
            seqs = {k.decode(): int(v) for k, v in next(results).items()}
            stale = {w.decode() for w in next(results)}
            index = indexes[m] = PrefixIndex(m)
            for w in workers[m]:
                hashes = [int.from_bytes(h, "big") for h in next(results)]
                tiers = {int.from_bytes(h, "big"): int(t) for h, t in next(results).items()}
                index.load_worker(w, seqs.get(w), hashes, stale=w in stale, tiers=tiers)
        with self._lock:
            self._indexes = indexes
            self._last_id = last[0][0] if last else b"0-0"

    # ---- lifecycle -----------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every publish queued so far has been written to Redis or dropped (Redis
        down). False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._unfinished == 0, timeout)

    def sync(self, timeout: float = 5.0) -> bool:
        """Wait until our publishes are in Redis and the consumer has read up to the stream's
        current end. False on timeout or while Redis is down."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        try:
            last = self._client.xrevrange(self._k("stream"), count=1)
        except _REDIS_DOWN:
            return False
        target = _id_tuple(last[0][0]) if last else (0, 0)
        while time.monotonic() < deadline:
            if self._healthy and _id_tuple(self._last_id) >= target:
                return True
            time.sleep(0.005)
        return False

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self._client.close()


def _id_tuple(entry_id: bytes | str) -> tuple[int, int]:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, n = raw.partition("-")
    return int(ms), int(n or 0)
