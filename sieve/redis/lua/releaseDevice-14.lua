--[[
  Ends a device's dispatch: drops its lock and serving mark, and schedules it again if it has work.
  Its wait restarts now (last_served_ms was set when it was claimed), so a backlog alone never wins; fair by
  cost, that much later (or earlier) as its claim moved it (chargeServe).

  Input:
    KEYS[1..11]  device       device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey      device dispatch lock
    KEYS[13]     servingKey   serving set
    KEYS[14]     devicesKey   active devices set

    ARGV[1]      now          now (ms; recorded as given in last_served_ms)
    ARGV[2]      token        lock token ("*" to force, for a holder known to be dead)
    ARGV[3]      mac          device (normalised MAC)

  Output:
    OK              released ("ready" again or "idle")
    LOCK_NOT_OWNED  the lock is held by another token: nothing changed (an expired lock still counts as the
                    caller's while the device's meta carries its token)
    (codes: includes/codes.lua)
]]
--@requires codes, deviceBlock, ownsLock, endDispatch, reschedule

local now = ARGV[1]
local token = ARGV[2]
local mac = ARGV[3]
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local servingKey = KEYS[13]
local devicesKey = KEYS[14]

local _, owned = ownsLock(device, lockKey, token)
if token ~= "*" and not owned then
  return CODE.LOCK_NOT_OWNED
end
endDispatch(device, lockKey, servingKey)
if redis.call("HGET", device.meta, "state") == "serving" then
  -- fair by cost: the wait starts as much after the release as the claim moved it (chargeServe)
  local lead = tonumber(redis.call("HGET", device.meta, "lead_ms") or "0")
  redis.call("HSET", device.meta, "defer_count", 0, "last_served_ms", tonumber(now) + lead)
  reschedule(device, tonumber(now), devicesKey)
end
return CODE.OK
