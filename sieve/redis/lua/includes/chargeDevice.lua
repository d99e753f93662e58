--[[
  Fair by cost (scheduler_svc/cost.py): a device whose tasks' worker time is known is served by start-time fair
  queueing instead of by count.

  noteCost(meta_key, wall_ms)
  Keeps what one of the device's tasks costs the worker pool in wall-clock time (worker time over the tasks
  running at once, ms; smoothed: meta "wall_ms"). A device whose meta is gone has nothing to keep it for.

  chargeServe(meta_key, taken, at, previous) -> ms
  The device is served at `at` and takes `taken` tasks. Without a known cost its next wait starts at `at` (by
  count: every serve restarts the wait). With one it starts at max(previous, at - LAG_MS) + taken x wall_ms,
  where `previous` is where its last serve put it: each serve moves it on by what its tasks will cost, so two
  backlogged devices get equal worker time whatever their tasks cost, and one that was away keeps at most LAG_MS
  of credit; at most MAX_LEAD_MS after `at`. Its wait never starts before its oldest task's enqueue either
  (scheduleDevice). Sets last_served_ms and keeps the lead over `at` in meta "lead_ms" for a release that comes
  later (releaseDevice); returns the new last_served_ms.
]]
local LAG_MS = 2000
local MAX_LEAD_MS = 30000

local function noteCost(metaKey, wall)
  if wall <= 0 or redis.call("EXISTS", metaKey) == 0 then return end
  local before = tonumber(redis.call("HGET", metaKey, "wall_ms") or "")
  if before then wall = before + 0.3 * (wall - before) end
  redis.call("HSET", metaKey, "wall_ms", wall)
end

local function chargeServe(metaKey, taken, at, previous)
  local wall = tonumber(redis.call("HGET", metaKey, "wall_ms") or "0")
  if wall <= 0 or taken == 0 then
    redis.call("HDEL", metaKey, "lead_ms")
    return at
  end
  local start = previous
  if start < at - LAG_MS then start = at - LAG_MS end
  local served = start + taken * wall
  if served > at + MAX_LEAD_MS then served = at + MAX_LEAD_MS end
  redis.call("HSET", metaKey, "last_served_ms", served, "lead_ms", served - at)
  return served
end
