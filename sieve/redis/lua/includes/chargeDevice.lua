--[[
  Fair by cost (scheduler_svc/cost.py): a device whose tasks' worker time is known is served by start-time fair
  queueing instead of by count.

  noteCost(meta_key, wall_ms, acked)
  Keeps what one of the device's tasks costs the worker pool in wall-clock time (worker time over the tasks
  running at once, ms; smoothed: meta "wall_ms"). A device whose meta is gone has nothing to keep it for. Of the
  `acked` tasks, those served while its cost was not known yet (meta "uncharged": its first serves, counted) are
  charged now: their cost goes into meta "debt_ms", added at its next serve — a device whose first batch of dear
  tasks went out by count pays for it, instead of keeping the head start.

  chargeServe(fields, gone, taken, at, previous, wall_ms, has_lead, debt_ms, uncharged) -> ms
  The device is served at `at` and takes `taken` tasks. Without a known cost its next wait starts at `at` (by
  count: every serve restarts the wait) and the tasks count as uncharged. With one it starts at
  max(previous, at - LAG_MS) + taken x wall_ms + its debt, where `previous` is where its last serve put it: each
  serve moves it on by what its tasks will cost, so two backlogged devices get equal worker time whatever their
  tasks cost, and one that fell behind keeps at most LAG_MS of credit; at most MAX_LEAD_MS after `at`. Its wait
  never starts before its oldest task's enqueue either (scheduleDevice), so a device back from a quiet time gets
  no credit for it. Sets last_served_ms and keeps the lead over `at` in meta "lead_ms" for a release that comes
  later (releaseDevice); returns the new last_served_ms. What it changes goes into `fields` (meta field -> new
  value) and `gone` (meta fields to delete), which popDevice writes with the rest of the serve; `wall_ms`,
  `has_lead`, `debt_ms` and `uncharged` are the meta's wall_ms, whether it holds a lead_ms, its debt_ms and its
  uncharged, as popDevice read them in the same step (it reads the meta once).

  costQuantum(wall, want) -> want (below): how many tasks such a device takes in one serve.
]]
local LAG_MS = 10000
local MAX_LEAD_MS = 30000
local QUANTUM_MS = 1000

--[[
  costQuantum(wall, want) -> want
  A device whose tasks' cost is known takes at most about QUANTUM_MS of them per serve (at least one): a batch of
  ten 3 s images would keep the pool for 30 s at a time and swing the shares by as much, whatever the charges.
]]
local function costQuantum(wall, want)
  if not wall or wall <= 0 then return want end
  local most = math.floor(QUANTUM_MS / wall)
  if most < 1 then most = 1 end
  if most < want then return most end
  return want
end

local function noteCost(metaKey, wall, acked)
  if wall <= 0 or redis.call("EXISTS", metaKey) == 0 then return end
  local m = redis.call("HMGET", metaKey, "wall_ms", "uncharged")
  local before, uncharged = tonumber(m[1] or ""), tonumber(m[2] or "0")
  if before then wall = before + 0.3 * (wall - before) end
  redis.call("HSET", metaKey, "wall_ms", wall)
  -- tasks served before the device's cost was known are charged now, at its next serve (chargeServe)
  if uncharged > 0 then
    local now = math.min(uncharged, acked or 1)
    redis.call("HSET", metaKey, "uncharged", uncharged - now)
    redis.call("HINCRBYFLOAT", metaKey, "debt_ms", now * wall)
  end
end

local function chargeServe(fields, gone, taken, at, previous, wall, hasLead, debt, uncharged)
  if taken == 0 then return at end
  wall = tonumber(wall or "0") or 0
  if wall <= 0 then
    if hasLead then gone[#gone + 1] = "lead_ms" end
    fields.uncharged = tonumber(uncharged or "0") + taken
    return at
  end
  debt = tonumber(debt or "0") or 0
  local start = previous
  if start < at - LAG_MS then start = at - LAG_MS end
  local served = start + taken * wall + debt
  if served > at + MAX_LEAD_MS then served = at + MAX_LEAD_MS end
  fields.last_served_ms, fields.lead_ms = served, served - at
  if debt > 0 then gone[#gone + 1] = "debt_ms" end
  return served
end
