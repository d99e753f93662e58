--[[
  Removes one queued task from its device's queues: CancelTask of a pending task, or the TTL sweep
  dropping an expired one.

  Input:
    KEYS[1..11]  device         device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     pendingKey     global pending counter
    KEYS[13]     overloadedKey  overloaded devices set
    KEYS[14]     devicesKey     active devices set
    KEYS[15]     callerKey      caller counts (caller -> open tasks; a removed task is no longer open)

    ARGV[1]      now            now (ms)
    ARGV[2]      mac            device (normalised MAC)
    ARGV[3]      taskId         task id
    ARGV[4]      maxPerDevice   per-device pending limit (the overloaded mark is cleared below it)

  Output:
    the removed entry (counters adjusted, device rescheduled or idle)
    false (nil) when it is not queued (leased, delayed, already gone, or never queued here)
]]
--@requires deviceBlock, parseEntry, countCaller, reschedule

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local taskId = ARGV[3]
local maxPerDevice = tonumber(ARGV[4])
local device = deviceBlock(KEYS, mac)
local pendingKey = KEYS[12]
local overloadedKey = KEYS[13]
local devicesKey = KEYS[14]
local callerKey = KEYS[15]

local prefix = taskId .. "|"
for p = 5, 1, -1 do
  local items = redis.call("LRANGE", device.queues[p], 0, -1)
  for _, item in ipairs(items) do
    if string.sub(item, 1, #prefix) == prefix then
      redis.call("LREM", device.queues[p], 1, item)
      local backlog = redis.call("HINCRBY", device.meta, "backlog", -1)
      redis.call("DECR", pendingKey)
      countCaller(callerKey, parseEntry(item), -1)
      if backlog < maxPerDevice then redis.call("SREM", overloadedKey, mac) end
      local state = redis.call("HGET", device.meta, "state")
      if state == "ready" then
        reschedule(device, now, devicesKey)
      elseif state == "backoff" and backlog <= 0 then
        -- nothing left to back off for; resumeDevice will find it idle
        redis.call("HSET", device.meta, "backlog", 0)
      end
      return item
    end
  end
end
return false
