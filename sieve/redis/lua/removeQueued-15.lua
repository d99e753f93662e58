--[[
  Removes one queued task from its device's queues: CancelTask of a pending task, or the TTL sweep
  dropping an expired one.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     global pending counter
    KEYS[13]     overloaded devices set
    KEYS[14]     active devices set
    KEYS[15]     caller counts (caller -> open tasks; a removed task is no longer open)

    ARGV[1]      now (ms)
    ARGV[2]      device (normalised MAC)
    ARGV[3]      task id
    ARGV[4]      per-device pending limit (the overloaded mark is cleared below it)

  Output:
    the removed entry (counters adjusted, device rescheduled or idle)
    false (nil) when it is not queued (leased, delayed, already gone, or never queued here)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "countCaller"

local mac = ARGV[2]
local prefix = ARGV[3] .. "|"
for p = 5, 1, -1 do
  local items = redis.call("LRANGE", KEYS[1 + p], 0, -1)
  for _, item in ipairs(items) do
    if string.sub(item, 1, #prefix) == prefix then
      redis.call("LREM", KEYS[1 + p], 1, item)
      local backlog = redis.call("HINCRBY", KEYS[1], "backlog", -1)
      redis.call("DECR", KEYS[12])
      countCaller(KEYS[15], parseEntry(item), -1)
      if backlog < tonumber(ARGV[4]) then redis.call("SREM", KEYS[13], mac) end
      local state = redis.call("HGET", KEYS[1], "state")
      if state == "ready" then
        if scheduleDevice(mac, tonumber(ARGV[1])) == "idle" then redis.call("SREM", KEYS[14], mac) end
      elseif state == "backoff" and backlog <= 0 then
        -- nothing left to back off for; resumeDevice will find it idle
        redis.call("HSET", KEYS[1], "backlog", 0)
      end
      return item
    end
  end
end
return false
