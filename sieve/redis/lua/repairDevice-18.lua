--[[
  Mends one device's own keys when they disagree (deviceFacts), in one atomic step: the reconciler's repair of
  what Redis lost behind Sieve's back (scheduler_svc/reconcile.py). The queues are what is true: the backlog
  becomes their count, the device joins the active set when it has work, it leaves every schedule set it sits
  in, and unless it is being served (lock held, or in the serving set) or backing off (in the backoff set), it
  is scheduled afresh from its queues (or becomes idle). The global pending counter is left alone (the
  reconciler recounts it once per pass: recountPending).

  Input:
    KEYS[1..11]  device block (meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     device dispatch lock
    KEYS[13]     serving set
    KEYS[14]     backoff set
    KEYS[15]     leases (unused; the same keys as locateTasks)
    KEYS[16]     lease data (unused)
    KEYS[17]     delayed set (unused)
    KEYS[18]     active devices set

    ARGV[1]      now (ms)
    ARGV[2]      device (normalised MAC)
    ARGV[3]      the device's weight

  Output:
    {problem, queued, backlog before}   problem "" when nothing was wrong (nothing changed)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "deviceFacts"

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local queued, backlog, state, problem = deviceFacts(mac)
if problem == "" then
  return {"", queued, backlog}
end
local serving = state == "serving" and (redis.call("EXISTS", KEYS[12]) == 1 or redis.call("ZSCORE", KEYS[13], mac))
local backingOff = state == "backoff" and redis.call("ZSCORE", KEYS[14], mac)
for p = 1, 5 do redis.call("ZREM", KEYS[6 + p], mac) end
redis.call("HSET", KEYS[1], "backlog", queued, "class", 0, "device", mac)
redis.call("HSETNX", KEYS[1], "weight", ARGV[3])
if queued > 0 then redis.call("SADD", KEYS[18], mac) end
if not (serving or backingOff) then
  redis.call("HDEL", KEYS[1], "token", "unschedulable_until_ms", "defer_reason")
  redis.call("HSET", KEYS[1], "state", "idle")
  if scheduleDevice(mac, now) == "idle" then redis.call("SREM", KEYS[18], mac) end
end
return {problem, queued, backlog}
