--[[
  Finishes leased tasks of one device: each lease is removed only when the ack's attempt (the fencing token) is
  the lease's current one; an ack of a stale or unknown lease changes nothing. An acked task is no longer
  outstanding for its device; a device left idle with nothing outstanding forgets its meta (forgetIdle), so that
  per-device state lasts only while the device has work.

  Input:
    KEYS[1]      leases (task_id -> deadline ms)
    KEYS[2]      lease data (task_id -> "mac|entry")
    KEYS[3]      caller counts (caller -> open tasks; an acked task is no longer open)
    KEYS[4]      meta hash of the device

    ARGV[1]      device (normalised MAC)
    ARGV[2..]    pairs: task_id, attempt

  Output:
    {r1, r2, ...}  per pair: 1 acked, 0 refused (stale attempt or no such lease)
    (a lease of another device is acked all the same, but counted for neither)
]]
--- @include "parseEntry"
--- @include "countCaller"
--- @include "countOutstanding"
--- @include "forgetIdle"

local prefix = ARGV[1] .. "|"
local out = {}
local mine = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local v = redis.call("HGET", KEYS[2], id)
  local ok = 0
  if v then
    local sep = string.find(v, "|", 1, true)
    local e = parseEntry(string.sub(v, sep + 1))
    if tostring(e.attempt) == ARGV[i + 1] then
      redis.call("HDEL", KEYS[2], id)
      redis.call("ZREM", KEYS[1], id)
      countCaller(KEYS[3], e, -1)
      if string.sub(v, 1, #prefix) == prefix then mine = mine + 1 end
      ok = 1
    end
  end
  out[#out + 1] = ok
end
if mine > 0 then
  countOutstanding(KEYS[4], -mine)
  forgetIdle(KEYS[4])
end
return out
