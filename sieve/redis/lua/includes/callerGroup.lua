--[[
  Caller groups: the first level of the fair order (rankNext). Every device belongs to the group of the caller
  that first queued work for it (deviceBlock); a group is ready while one of its devices is, and waits from
  max(when the caller was last served, its longest-waiting ready device's wait start): the score of the group in
  the callers set of its weight (device.callers).

  callerReady(device, since_ms)   the device became ready with this wait start: its group is ready, waiting
                                  at most since that (ZADD LT: an older wait start is kept)
  callerServed(device, at_ms)     one of the group's devices was served at at_ms: its wait restarts then, or
                                  the group leaves the callers set when no device of it is ready
  unscheduleDevice(device)        the device leaves its schedule set and its group's ready set (claimed, lost)
]]
local function callerReady(device, since)
  local served = tonumber(redis.call("HGET", device.callerServed, device.group) or "0")
  if served > since then since = served end
  redis.call("ZADD", device.callers, "LT", since, device.group)
end

local function callerServed(device, at)
  redis.call("HSET", device.callerServed, device.group, at)
  local head = redis.call("ZRANGE", device.groupReady, 0, 0, "WITHSCORES")
  if #head == 0 then
    redis.call("ZREM", device.callers, device.group)
    return
  end
  local since = tonumber(head[2])
  if at > since then since = at end
  redis.call("ZADD", device.callers, since, device.group)
end

local function unscheduleDevice(device, class)
  if class and class > 0 then
    redis.call("ZREM", device.schedules[class], device.mac)
  else
    for p = 1, 5 do redis.call("ZREM", device.schedules[p], device.mac) end
  end
  redis.call("ZREM", device.groupReady, device.mac)
end
