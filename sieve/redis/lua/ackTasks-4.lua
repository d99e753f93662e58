--[[
  Finishes leased tasks of one device: each lease is removed only when the ack's attempt (the fencing token) is
  the lease's current one; an ack of a stale or unknown lease changes nothing. An acked task is no longer
  outstanding for its device; a device left idle with nothing outstanding forgets its meta (forgetIdle), so that
  per-device state lasts only while the device has work. Fair by cost: `wall` (what one of the acked tasks cost
  the worker pool in wall-clock time, ms) goes into the device's cost (noteCost) when an ack was its own.

  Input:
    KEYS[1]      leasesKey     leases (task_id -> deadline ms)
    KEYS[2]      leaseDataKey  lease data (task_id -> "mac|entry")
    KEYS[3]      callerKey     caller counts (caller -> open tasks; an acked task is no longer open)
    KEYS[4]      metaKey       meta hash of the device

    ARGV[1]      mac           device (normalised MAC)
    ARGV[2]      wall          wall-clock cost of one of the acked tasks (ms; 0: not known, counted by number)
    ARGV[3..]    acks          pairs: task_id, attempt

  Output:
    {r1, r2, ...}  per pair: 1 acked, 0 refused (stale attempt or no such lease)
    (a lease of another device is acked all the same, but counted for neither)
]]
--@requires slice, parseEntry, countCaller, countOutstanding, forgetIdle, chargeDevice

local leasesKey = KEYS[1]
local leaseDataKey = KEYS[2]
local callerKey = KEYS[3]
local metaKey = KEYS[4]
local mac = ARGV[1]
local wall = tonumber(ARGV[2])
local acks = slice(ARGV, 3)

local prefix = mac .. "|"
local out = {}
local mine = 0
for i = 1, #acks, 2 do
  local id = acks[i]
  local v = redis.call("HGET", leaseDataKey, id)
  local ok = 0
  if v then
    local sep = string.find(v, "|", 1, true)
    local e = parseEntry(string.sub(v, sep + 1))
    if tostring(e.attempt) == acks[i + 1] then
      redis.call("HDEL", leaseDataKey, id)
      redis.call("ZREM", leasesKey, id)
      countCaller(callerKey, e, -1)
      if string.sub(v, 1, #prefix) == prefix then mine = mine + 1 end
      ok = 1
    end
  end
  out[#out + 1] = ok
end
if mine > 0 then
  countOutstanding(metaKey, -mine)
  if not forgetIdle(metaKey) then noteCost(metaKey, wall) end
end
return out
