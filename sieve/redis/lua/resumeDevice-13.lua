--[[
  Ends a device's backoff once unschedulable_until has passed and schedules it again.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     backoff set
    KEYS[13]     active devices set

    ARGV[1]      now (ms)
    ARGV[2]      device (normalised MAC)

  Output:
    1  resumed
    0  not due yet, or not in backoff (a stale backoff entry is removed)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"

local now = tonumber(ARGV[1])
local mac = ARGV[2]
if redis.call("HGET", KEYS[1], "state") ~= "backoff" then
  redis.call("ZREM", KEYS[12], mac)
  return 0
end
local untilMs = tonumber(redis.call("HGET", KEYS[1], "unschedulable_until_ms") or "0")
if untilMs > now then
  return 0
end
redis.call("ZREM", KEYS[12], mac)
redis.call("HDEL", KEYS[1], "unschedulable_until_ms", "defer_reason")
if scheduleDevice(mac, now) == "idle" then redis.call("SREM", KEYS[13], mac) end
return 1
