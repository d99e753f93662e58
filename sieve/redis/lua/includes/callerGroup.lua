--[[
  Caller groups: the first level of the fair order (rankNext), by start-time fair queueing. Every device belongs
  to the group of the caller that first queued work for it (deviceBlock); a group is ready while one of its
  devices is. Each group has a virtual start S (device.callerServed: group -> S), and the installation a
  virtual time V (device.vtime): the S of the group served last. A ready group's score in the callers set of
  its weight (device.callers) is its S; the lowest score goes first.

  callerReady(device)                 a device of the group became ready: a group that was not ready joins at
                                      max(its S, V) (no credit from a quiet time, no debt to new callers)
  callerServed(device, charge)        one of the group's devices was served and took tasks worth `charge`
                                      (tasks x the time one takes, over the caller's weight): V becomes the
                                      group's score, S becomes max(S, V) + charge, so a caller that took a
                                      batch waits until the others have had as much, whatever the number of
                                      their devices; the group leaves the callers set when no device of it is
                                      ready
  unscheduleDevice(device[, class])   the device leaves its schedule set (every one without `class`) and its
                                      group's ready set
]]
-- V and each group's S as this script call last read or wrote them: only these functions touch those keys, so
-- a script serving a thousand devices of one caller reads each once (written through at every change)
local vtimes, starts = {}, {}

local function virtualTime(device)
  local v = vtimes[device.vtime]
  if v == nil then
    v = tonumber(redis.call("GET", device.vtime) or "0")
    vtimes[device.vtime] = v
  end
  return v
end

local function virtualStart(device)
  local key = device.callerServed .. "\0" .. device.group
  local start = starts[key]
  if start == nil then
    start = tonumber(redis.call("HGET", device.callerServed, device.group) or "0")
    starts[key] = start
  end
  return start, key
end

local function callerReady(device)
  if redis.call("ZSCORE", device.callers, device.group) then return end
  redis.call("SADD", device.groups, device.group) -- for the reconciler's look at every group's sets
  local start = virtualStart(device)
  local v = virtualTime(device)
  if v > start then start = v end
  redis.call("ZADD", device.callers, start, device.group)
end

local function callerServed(device, charge)
  local v = virtualTime(device)
  local score = tonumber(redis.call("ZSCORE", device.callers, device.group) or "0")
  if score > v then
    v = score
    redis.call("SET", device.vtime, v)
    vtimes[device.vtime] = v
  end
  local start, key = virtualStart(device)
  if v > start then start = v end
  start = start + charge
  redis.call("HSET", device.callerServed, device.group, start)
  starts[key] = start
  if redis.call("ZCARD", device.groupReady) == 0 then
    redis.call("ZREM", device.callers, device.group)
  else
    redis.call("ZADD", device.callers, start, device.group)
  end
end

local function unscheduleDevice(device, class)
  if class and class > 0 then
    redis.call("ZREM", device.schedules[class], device.mac)
  else
    for p = 1, 5 do redis.call("ZREM", device.schedules[p], device.mac) end
  end
  redis.call("ZREM", device.groupReady, device.mac)
end
