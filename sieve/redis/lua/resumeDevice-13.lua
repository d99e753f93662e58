--[[
  Ends a device's backoff once unschedulable_until has passed and schedules it again.

  Input:
    KEYS[1..11]  device       device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     backoffKey   backoff set
    KEYS[13]     devicesKey   active devices set

    ARGV[1]      now          now (ms)
    ARGV[2]      mac          device (normalised MAC)

  Output:
    1  resumed
    0  not due yet, or not in backoff (a stale backoff entry is removed)
]]
--@requires deviceBlock, reschedule

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local device = deviceBlock(KEYS, mac)
local backoffKey = KEYS[12]
local devicesKey = KEYS[13]

if redis.call("HGET", device.meta, "state") ~= "backoff" then
  redis.call("ZREM", backoffKey, mac)
  return 0
end
local untilMs = tonumber(redis.call("HGET", device.meta, "unschedulable_until_ms") or "0")
if untilMs > now then
  return 0
end
redis.call("ZREM", backoffKey, mac)
redis.call("HDEL", device.meta, "unschedulable_until_ms", "defer_reason")
reschedule(device, now, devicesKey)
return 1
