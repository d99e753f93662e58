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
  flushCallerGroups()                 writes what callerServed changed (a script that serves calls it last)
]]
-- V, each group's S and each group's score in its callers set as this script call last read or wrote them: only
-- these functions (and rankNext, which tells callerLeft) touch those keys, so a script serving a thousand devices
-- of one caller reads each once. The callers sets are written through (rankNext reads them); V and S are read
-- by these functions alone, so a call writes each once, at its end (flushCallerGroups: every script that serves
-- a device calls it last).
local vtimes, starts, scores = {}, {}, {}
local dirtyV, dirtyS = {}, {}

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

-- the group's score in its callers set, false when it is not in it
local function callerScore(device)
  local key = device.callers .. "\0" .. device.group
  local score = scores[key]
  if score == nil then
    score = redis.call("ZSCORE", device.callers, device.group)
    score = score and tonumber(score) or false
    scores[key] = score
  end
  return score, key
end

-- rankNext dropped a group with no ready device from a callers set
local function callerLeft(callersKey, group)
  scores[callersKey .. "\0" .. group] = false
end

local function callerReady(device)
  local score, scoreKey = callerScore(device)
  if score then return end
  redis.call("SADD", device.groups, device.group) -- for the reconciler's look at every group's sets
  local start = virtualStart(device)
  local v = virtualTime(device)
  if v > start then start = v end
  redis.call("ZADD", device.callers, start, device.group)
  scores[scoreKey] = start
end

local function callerServed(device, charge)
  local v = virtualTime(device)
  local score, scoreKey = callerScore(device)
  score = score or 0
  if score > v then
    v = score
    vtimes[device.vtime] = v
    dirtyV[device.vtime] = true
  end
  local start, key = virtualStart(device)
  if v > start then start = v end
  start = start + charge
  starts[key] = start
  dirtyS[key] = {device.callerServed, device.group}
  if redis.call("ZCARD", device.groupReady) == 0 then
    redis.call("ZREM", device.callers, device.group)
    scores[scoreKey] = false
  else
    redis.call("ZADD", device.callers, start, device.group)
    scores[scoreKey] = start
  end
end

-- writes the V and S that callerServed changed in this call
local function flushCallerGroups()
  for key in pairs(dirtyV) do redis.call("SET", key, vtimes[key]) end
  local byHash = {}
  for key, where in pairs(dirtyS) do
    local args = byHash[where[1]]
    if not args then
      args = {}
      byHash[where[1]] = args
    end
    args[#args + 1] = where[2]
    args[#args + 1] = starts[key]
  end
  for hash, args in pairs(byHash) do redis.call("HSET", hash, unpack(args)) end
  dirtyV, dirtyS = {}, {}
end

local function unscheduleDevice(device, class)
  if class and class > 0 then
    redis.call("ZREM", device.schedules[class], device.mac)
  else
    for p = 1, 5 do redis.call("ZREM", device.schedules[p], device.mac) end
  end
  redis.call("ZREM", device.groupReady, device.mac)
end
