--[[
  Takes one slot of a pool for a holder, under a lease, never more than the pool's maximum: the pool is a sorted
  set of holder -> lease deadline (ms); leases past their deadline are reclaimed first (a holder that died gives its
  slot back by itself), then the holder gets a slot if it already holds one (its lease is renewed) or if fewer
  than `max` are held. One atomic call: two engine replicas can never over-commit a pool.

  Input:
    KEYS[1]      poolKey       the pool's holders (zset: holder -> lease deadline, ms)

    ARGV[1]      now           now (ms), or "" for Redis's clock
    ARGV[2]      maxSlots      the pool's maximum (>= 0)
    ARGV[3]      holder        who takes the slot (a job's task, stage and attempt)
    ARGV[4]      leaseMs       how long the slot is held without a renewal (ms, > 0)

  Output:
    {granted, held, reclaimed}   granted: 1 when the holder holds a slot now, 0 when the pool is full;
                                 held: slots held after the call; reclaimed: expired leases removed
]]
--@requires nowMs
local poolKey = KEYS[1]
local now = nowMs(ARGV[1])
local maxSlots = tonumber(ARGV[2])
local holder = ARGV[3]
local leaseMs = tonumber(ARGV[4])

local reclaimed = redis.call("ZREMRANGEBYSCORE", poolKey, "-inf", now)
if redis.call("ZSCORE", poolKey, holder) then
  redis.call("ZADD", poolKey, now + leaseMs, holder)
  return {1, redis.call("ZCARD", poolKey), reclaimed}
end
local held = redis.call("ZCARD", poolKey)
if held >= maxSlots then
  return {0, held, reclaimed}
end
redis.call("ZADD", poolKey, now + leaseMs, holder)
return {1, held + 1, reclaimed}
