"""The pools' desired sizes kept in Redis, so a restarted controller keeps them."""

from __future__ import annotations

import json
import logging

logger = logging.getLogger(__name__)

_REDIS_KEY = "baton:controller:pools"


class SavedPoolSizes:
    """Reads and writes the desired pool sizes; Redis down is said in the log, never raised."""

    def __init__(self, redis_url: str) -> None:
        self._redis = None
        self._url = redis_url

    def restore(self, desired: dict[str, int]) -> dict[str, int]:
        """The sizes saved earlier when they name the same pools, else `desired`; saved."""
        import redis

        try:
            self._redis = redis.Redis.from_url(self._url, socket_timeout=2.0)
            saved = self._redis.get(_REDIS_KEY)
        except Exception as e:  # Redis down: start from the spec, say so
            logger.warning("controller: Redis unavailable (%s); using the pool sizes given", e)
            return desired
        if saved:
            loaded = json.loads(saved)
            if set(loaded) == set(desired):
                logger.info("controller: restored pool sizes %s from Redis", loaded)
                desired = {k: int(v) for k, v in loaded.items()}
        self.save(desired)
        return desired

    def save(self, desired: dict[str, int]) -> None:
        if self._redis is None:
            return
        try:
            self._redis.set(_REDIS_KEY, json.dumps(desired))
        except Exception as e:
            logger.warning("controller: could not save pool sizes to Redis: %s", e)
