--[[
  Enqueues a device's new tasks, with admission control, in one atomic step.

  Input:
    KEYS[1]      device meta hash
    KEYS[2..6]   device queues, priority 1..5
    KEYS[7..11]  schedule sets of the device's weight, priority 1..5
    KEYS[12]     global pending counter
    KEYS[13]     overloaded devices set
    KEYS[14]     active devices set
    KEYS[15]     generation (exists while Redis holds the queues rebuilt from PostgreSQL)

    ARGV[1]      now (ms)
    ARGV[2]      global pending limit
    ARGV[3]      per-device pending limit
    ARGV[4]      the device's weight
    ARGV[5]      device (normalised MAC)
    ARGV[6]      wake channel (published to when the device becomes schedulable)
    ARGV[7]      1 to refuse when the generation key is missing (Redis lost its memory and has not been
                 rebuilt yet), 0 for the rebuild itself
    ARGV[8..]    entries "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace"

  Output:
    {1, backlog, pending}    enqueued
    {-1, backlog, pending}   refused: the global pending limit would be exceeded
    {-2, backlog, pending}   refused: the device's limit would be exceeded (device marked overloaded)
    {-4, 0, 0}               refused: Redis lost its memory and the queues are not rebuilt yet
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"

local now = tonumber(ARGV[1])
local mac = ARGV[5]
local n = #ARGV - 7
if ARGV[7] == "1" and redis.call("EXISTS", KEYS[15]) == 0 then
  return {-4, 0, 0}
end
local pending = tonumber(redis.call("GET", KEYS[12]) or "0")
local backlog = tonumber(redis.call("HGET", KEYS[1], "backlog") or "0")

if pending + n > tonumber(ARGV[2]) then
  return {-1, backlog, pending}
end
if backlog + n > tonumber(ARGV[3]) then
  redis.call("SADD", KEYS[13], mac)
  return {-2, backlog, pending}
end

for i = 8, #ARGV do
  local e = parseEntry(ARGV[i])
  redis.call("RPUSH", KEYS[1 + e.prio], ARGV[i])
end
backlog = redis.call("HINCRBY", KEYS[1], "backlog", n)
pending = redis.call("INCRBY", KEYS[12], n)
redis.call("HSET", KEYS[1], "weight", ARGV[4], "device", mac)
redis.call("SADD", KEYS[14], mac)

local state = redis.call("HGET", KEYS[1], "state")
if state == false or state == "idle" or state == "ready" then
  -- a ready device may have gained a higher priority: scheduleDevice moves it to the right set
  local became = scheduleDevice(mac, now)
  if state ~= "ready" and became == "ready" then
    redis.call("PUBLISH", ARGV[6], mac)
  end
end
-- "serving" and "backoff" devices are rescheduled by releaseDevice / resumeDevice
return {1, backlog, pending}
