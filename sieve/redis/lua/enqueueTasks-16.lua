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
    KEYS[16]     caller counts (caller -> tasks it has open: queued, leased or delayed)

    ARGV[1]      now (ms)
    ARGV[2]      global pending limit
    ARGV[3]      per-device pending limit
    ARGV[4]      the device's weight
    ARGV[5]      device (normalised MAC)
    ARGV[6]      wake channel (published to when the device becomes schedulable)
    ARGV[7]      1 to refuse when the generation key is missing (Redis lost its memory and has not been
                 rebuilt yet), 0 for the rebuild itself
    ARGV[8]      per-caller limit of open tasks, applied to each caller of the entries
    ARGV[9..]    entries "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace[|caller]"

  Output:
    {1, backlog, pending, open}    enqueued (open: the first caller's open tasks now, 0 without a caller)
    {-1, backlog, pending, open}   refused: the global pending limit would be exceeded
    {-5, backlog, pending, open}   refused: a caller's limit would be exceeded (open: that caller's count)
    {-2, backlog, pending, open}   refused: the device's limit would be exceeded (device marked overloaded)
    {-4, 0, 0, 0}                  refused: Redis lost its memory and the queues are not rebuilt yet
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"

local now = tonumber(ARGV[1])
local mac = ARGV[5]
local n = #ARGV - 8
if ARGV[7] == "1" and redis.call("EXISTS", KEYS[15]) == 0 then
  return {-4, 0, 0, 0}
end
local pending = tonumber(redis.call("GET", KEYS[12]) or "0")
local backlog = tonumber(redis.call("HGET", KEYS[1], "backlog") or "0")

-- the entries' callers, in order of first appearance, with their counts
local entries, callers, incoming = {}, {}, {}
for i = 9, #ARGV do
  local e = parseEntry(ARGV[i])
  entries[#entries + 1] = e
  if e.caller ~= "" then
    if not incoming[e.caller] then
      callers[#callers + 1] = e.caller
      incoming[e.caller] = 0
    end
    incoming[e.caller] = incoming[e.caller] + 1
  end
end
local opened = {}
for i, caller in ipairs(callers) do
  opened[i] = tonumber(redis.call("HGET", KEYS[16], caller) or "0")
end
local first = opened[1] or 0

if pending + n > tonumber(ARGV[2]) then
  return {-1, backlog, pending, first}
end
for i, caller in ipairs(callers) do
  if opened[i] + incoming[caller] > tonumber(ARGV[8]) then
    return {-5, backlog, pending, opened[i]}
  end
end
if backlog + n > tonumber(ARGV[3]) then
  redis.call("SADD", KEYS[13], mac)
  return {-2, backlog, pending, first}
end

for i = 9, #ARGV do
  redis.call("RPUSH", KEYS[1 + entries[i - 8].prio], ARGV[i])
end
for i, caller in ipairs(callers) do
  opened[i] = redis.call("HINCRBY", KEYS[16], caller, incoming[caller])
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
return {1, backlog, pending, opened[1] or 0}
