--[[
  Finishes leased tasks of many devices in one atomic step: each lease is removed only when the ack's attempt (the
  fencing token) is the lease's current one; an ack of a stale or unknown lease changes nothing. An acked task is
  no longer outstanding for its device; a device left idle with nothing outstanding forgets its meta
  (forgetIdle), so that per-device state lasts only while the device has work. Fair by cost: each device's
  `wall` (what one of its acked tasks cost the worker pool in wall-clock time, ms) goes into its cost
  (noteCost). A worker's acks of tasks of 50 devices are one call, not 50: the meta keys are named in the
  script from the hash tag.

  Input:
    KEYS[1]      leasesKey     leases (task_id -> deadline ms)
    KEYS[2]      leaseDataKey  lease data (task_id -> "mac|entry")
    KEYS[3]      callerKey     caller counts (caller -> open tasks; an acked task is no longer open)

    ARGV[1]      base          the keys' hash tag ("{prefix}")
    ARGV[2..]    groups        per device: mac, wall (ms; 0: not known), n, then n pairs: task_id, attempt

  Output:
    {r1, r2, ...}  per pair, in order: 1 acked, 0 refused (stale attempt or no such lease)
    (a lease of another device than the one it is given under is acked all the same, but counted for neither)
]]
--@requires slice, parseEntry, countCaller, settleAcked, chargeDevice

local leasesKey = KEYS[1]
local leaseDataKey = KEYS[2]
local callerKey = KEYS[3]
local base = ARGV[1]
local groups = slice(ARGV, 2)

local out = {}
local i = 1
while i <= #groups do
  local mac, wall, n = groups[i], tonumber(groups[i + 1]), tonumber(groups[i + 2])
  local metaKey = base .. ":meta:" .. mac
  local prefix = mac .. "|"
  local mine = 0
  for j = i + 3, i + 2 + 2 * n, 2 do
    local id = groups[j]
    local v = redis.call("HGET", leaseDataKey, id)
    local ok = 0
    if v then
      local sep = string.find(v, "|", 1, true)
      local e = parseEntry(string.sub(v, sep + 1))
      if tostring(e.attempt) == groups[j + 1] then
        redis.call("HDEL", leaseDataKey, id)
        redis.call("ZREM", leasesKey, id)
        countCaller(callerKey, e, -1)
        if string.sub(v, 1, #prefix) == prefix then mine = mine + 1 end
        ok = 1
      end
    end
    out[#out + 1] = ok
  end
  if mine > 0 and not settleAcked(metaKey, mine) then noteCost(metaKey, wall, mine) end
  i = i + 3 + 2 * n
end
return out
