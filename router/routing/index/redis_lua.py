"""The Lua side of the Redis index store (redis_store.py): each script runs atomically,
so a worker's set, its last seq and the stream entry always change together."""

from __future__ import annotations

from typing import Any

from core.events import AllBlocksCleared, BlockStored, KVEventBatch

# KEYS: stream, models, workers, seqs, wset, stale. ARGV: model, worker, seq, payload, maxlen,
# self_contained (0/1), then groups "S"|"R" n h1..hn | "C". Mirrors prefix_index.classify_seq.
PUBLISH_LUA = """
local seq = tonumber(ARGV[3])
local sc = ARGV[6] == '1'
local last = redis.call('HGET', KEYS[4], ARGV[2])
local outcome = 'applied'
if last then
  last = tonumber(last)
  if sc then
    if seq < last then outcome = 'restart' end
  elseif seq == last then return 'duplicate'
  elseif seq < last then
    if seq == 0 then outcome = 'restart' else outcome = 'regression' end
  elseif seq > last + 1 then outcome = 'gap' end
elseif seq ~= 0 and not sc then outcome = 'unknown' end
if outcome ~= 'applied' then redis.call('DEL', KEYS[5]) end
if outcome == 'gap' or outcome == 'regression' or outcome == 'unknown' then
  redis.call('SADD', KEYS[6], ARGV[2])
elseif sc or seq == 0 then
  redis.call('SREM', KEYS[6], ARGV[2])
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if outcome ~= 'regression' then
  local i = 7
  while i <= #ARGV do
    local op = ARGV[i]
    if op == 'C' then
      redis.call('DEL', KEYS[5]); i = i + 1
    else
      local n = tonumber(ARGV[i + 1])
      local first, stop = i + 2, i + 1 + n
      while first <= stop do
        local e = math.min(first + 4999, stop)
        if op == 'S' then redis.call('SADD', KEYS[5], unpack(ARGV, first, e))
        else redis.call('SREM', KEYS[5], unpack(ARGV, first, e)) end
        first = e + 1
      end
      i = stop + 1
    end
  end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'm', ARGV[1], 'w', ARGV[2],
  'k', 'b', 'd', ARGV[4])
return outcome
"""

# KEYS: stream, workers, seqs, wset, stale. ARGV: model, worker, maxlen.
REMOVE_LUA = """
redis.call('DEL', KEYS[4])
redis.call('SREM', KEYS[5], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'm', ARGV[1], 'w', ARGV[2], 'k', 'x')
return 1
"""


def hash_bytes(h: int) -> bytes:
    return h.to_bytes(8, "big")


def event_args(batch: KVEventBatch) -> list[Any]:
    args: list[Any] = []
    for ev in batch.events:
        if isinstance(ev, AllBlocksCleared):
            args.append("C")
        else:
            args += ["S" if isinstance(ev, BlockStored) else "R", len(ev.block_hashes)]
            args += [hash_bytes(h) for h in ev.block_hashes]
    return args
