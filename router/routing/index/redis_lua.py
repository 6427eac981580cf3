"""The Lua side of the Redis index store (redis_store.py): each script runs atomically,
so a worker's set, its last seq and the stream entry always change together."""

from __future__ import annotations

from typing import Any

from core.events import AllBlocksCleared, BlockStored, BlockTiered, KVEventBatch

# KEYS: stream, models, workers, seqs, wset, stale, wtiers (hash: block -> offload tier, for the
# blocks the worker holds only there). ARGV: model, worker, seq, payload, maxlen, self_contained
# (0/1), then groups "S"|"R" n h1..hn | "T" tier n h1..hn | "C". Mirrors
# prefix_index.classify_seq and PrefixIndex.apply.
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
if outcome ~= 'applied' then redis.call('DEL', KEYS[5], KEYS[7]) end
if outcome == 'gap' or outcome == 'regression' or outcome == 'unknown' then
  redis.call('SADD', KEYS[6], ARGV[2])
elseif sc or seq == 0 then
  redis.call('SREM', KEYS[6], ARGV[2])
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if outcome ~= 'regression' then
  local tiered = redis.call('EXISTS', KEYS[7]) == 1
  local i = 7
  while i <= #ARGV do
    local op = ARGV[i]
    if op == 'C' then
      redis.call('DEL', KEYS[5], KEYS[7]); tiered = false; i = i + 1
    else
      local tier = nil
      if op == 'T' then tier = ARGV[i + 1]; i = i + 1 end
      local n = tonumber(ARGV[i + 1])
      local first, stop = i + 2, i + 1 + n
      while first <= stop do
        local e = math.min(first + 4999, stop)
        if op == 'R' then redis.call('SREM', KEYS[5], unpack(ARGV, first, e))
        else redis.call('SADD', KEYS[5], unpack(ARGV, first, e)) end
        if tier then
          for j = first, e do redis.call('HSET', KEYS[7], ARGV[j], tier) end
          tiered = true
        elseif tiered then
          redis.call('HDEL', KEYS[7], unpack(ARGV, first, e))
        end
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

# KEYS: stream, workers, seqs, wset, stale, wtiers. ARGV: model, worker, maxlen.
REMOVE_LUA = """
redis.call('DEL', KEYS[4], KEYS[6])
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
        elif isinstance(ev, BlockTiered):
            args += ["T", ev.tier, len(ev.block_hashes)]
            args += [hash_bytes(h) for h in ev.block_hashes]
        else:
            args += ["S" if isinstance(ev, BlockStored) else "R", len(ev.block_hashes)]
            args += [hash_bytes(h) for h in ev.block_hashes]
    return args
