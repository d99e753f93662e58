--[[
  Enqueues a device's new tasks, with admission control, in one atomic step.

  Input:
    KEYS[1..11]  device         device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     pendingKey     global pending counter
    KEYS[13]     overloadedKey  overloaded devices set
    KEYS[14]     devicesKey     active devices set
    KEYS[15]     generationKey  generation (exists while Redis holds the queues rebuilt from PostgreSQL)
    KEYS[16]     callerKey      caller counts (caller -> tasks it has open: queued, leased or delayed)

    ARGV[1]      now            now (ms)
    ARGV[2]      maxPending     global pending limit
    ARGV[3]      maxPerDevice   per-device pending limit
    ARGV[4]      weight         the device's weight
    ARGV[5]      mac            device (normalised MAC)
    ARGV[6]      wakeChannel    wake channel (published to when the device becomes schedulable)
    ARGV[7]      needsRebuilt   1 to refuse when the generation key is missing (Redis lost its memory and has
                                not been rebuilt yet), 0 for the rebuild itself
    ARGV[8]      maxPerCaller   per-caller limit of open tasks, applied to each caller of the entries
    ARGV[9]      group          the caller group of a device new to Redis ("" for "-"; a known device keeps its own)
    ARGV[10]     cweight        that caller's weight
    ARGV[11..]   raws           entries (sieve/redis/entry.py):
                                "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace[|caller]"

  Output:
    {OK, backlog, pending, open}               enqueued (open: the first caller's open tasks now, 0 without one)
    {GLOBAL_LIMIT, backlog, pending, open}     refused: the global pending limit would be exceeded
    {CALLER_LIMIT, backlog, pending, open}     refused: a caller's limit would be exceeded (open: that caller's)
    {DEVICE_LIMIT, backlog, pending, open}     refused: the device's limit would be exceeded (marked overloaded)
    {REDIS_NOT_READY, 0, 0, 0}                 refused: Redis lost its memory and the queues are not rebuilt yet
    (codes: includes/codes.lua)
]]
--@requires codes, slice, deviceBlock, parseEntry, scheduleDevice

local now = tonumber(ARGV[1])
local maxPending = tonumber(ARGV[2])
local maxPerDevice = tonumber(ARGV[3])
local weight = ARGV[4]
local mac = ARGV[5]
local wakeChannel = ARGV[6]
local needsRebuilt = ARGV[7] == "1"
local maxPerCaller = tonumber(ARGV[8])
local group = ARGV[9]
local cweight = ARGV[10]
local raws = slice(ARGV, 11)
local device = deviceBlock(KEYS, mac, group, cweight)
local pendingKey = KEYS[12]
local overloadedKey = KEYS[13]
local devicesKey = KEYS[14]
local generationKey = KEYS[15]
local callerKey = KEYS[16]

local n = #raws
if needsRebuilt and redis.call("EXISTS", generationKey) == 0 then
  return {CODE.REDIS_NOT_READY, 0, 0, 0}
end
local pending = tonumber(redis.call("GET", pendingKey) or "0")
local backlog = tonumber(redis.call("HGET", device.meta, "backlog") or "0")

-- the entries' callers, in order of first appearance, with their counts
local entries, callers, incoming = {}, {}, {}
for _, raw in ipairs(raws) do
  local e = parseEntry(raw)
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
  opened[i] = tonumber(redis.call("HGET", callerKey, caller) or "0")
end
local first = opened[1] or 0

if pending + n > maxPending then
  return {CODE.GLOBAL_LIMIT, backlog, pending, first}
end
for i, caller in ipairs(callers) do
  if opened[i] + incoming[caller] > maxPerCaller then
    return {CODE.CALLER_LIMIT, backlog, pending, opened[i]}
  end
end
if backlog + n > maxPerDevice then
  redis.call("SADD", overloadedKey, mac)
  return {CODE.DEVICE_LIMIT, backlog, pending, first}
end

for i, raw in ipairs(raws) do
  redis.call("RPUSH", device.queues[entries[i].prio], raw)
end
for i, caller in ipairs(callers) do
  opened[i] = redis.call("HINCRBY", callerKey, caller, incoming[caller])
end
backlog = redis.call("HINCRBY", device.meta, "backlog", n)
pending = redis.call("INCRBY", pendingKey, n)
redis.call("HSET", device.meta, "weight", weight, "device", mac)
redis.call("SADD", devicesKey, mac)

local state = redis.call("HGET", device.meta, "state")
if state == false or state == "idle" or state == "ready" then
  -- a ready device may have gained a higher priority: scheduleDevice moves it to the right set
  local became = scheduleDevice(device, now)
  if state ~= "ready" and became == "ready" then
    redis.call("PUBLISH", wakeChannel, mac)
  end
end
-- "serving" and "backoff" devices are rescheduled by releaseDevice / resumeDevice
return {CODE.OK, backlog, pending, opened[1] or 0}
