--[[
  Ends a device's dispatch: drops its lock and serving mark, and schedules it again if it has work.
  Its wait restarts now (last_served_ms was set when it was claimed), so a backlog alone never wins.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     device dispatch lock
    KEYS[13]     serving set
    KEYS[14]     active devices set

    ARGV[1]      now (ms)
    ARGV[2]      lock token ("*" to force, for a holder known to be dead)
    ARGV[3]      device (normalised MAC)

  Output:
    1   released ("ready" again or "idle")
    -6  the lock is held by another token: nothing changed (an expired lock still counts as the
        caller's while the device's meta carries its token)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "ownsLock"

local mac = ARGV[3]
local holder, owned = ownsLock(KEYS[12], ARGV[2])
if ARGV[2] ~= "*" and not owned then
  return -6
end
if holder then redis.call("DEL", KEYS[12]) end
redis.call("ZREM", KEYS[13], mac)
redis.call("HDEL", KEYS[1], "token")
if redis.call("HGET", KEYS[1], "state") == "serving" then
  redis.call("HSET", KEYS[1], "defer_count", 0, "last_served_ms", ARGV[1])
  if scheduleDevice(mac, tonumber(ARGV[1])) == "idle" then
    redis.call("SREM", KEYS[14], mac)
  end
end
return 1
