--[[
  A device's tasks of some types cannot be served now (no live worker takes their type, or GPU workers are
  expected and none is alive): those tasks wait, the device does not. The tasks taken in this dispatch and
  every task of those types still queued for the device move to the delayed set, each for
  min(base x 2^(d-1), max) where d is its own defer count (raised here); a task deferred max_defers times is
  dead-lettered instead. Then the device is released and scheduled again for what it has left (its other
  types keep flowing); promoteDelayed brings the deferred tasks back to the front of their queues when due.
  Tasks already past their TTL stay queued (the next pop drops them as expired).

  Input:
    KEYS[1..11]  device         device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey        device dispatch lock
    KEYS[13]     servingKey     serving set
    KEYS[14]     pendingKey     global pending counter
    KEYS[15]     leasesKey      leases
    KEYS[16]     leaseDataKey   lease data
    KEYS[17]     deadKey        dead-letter list
    KEYS[18]     devicesKey     active devices set
    KEYS[19]     delayedKey     delayed set ("mac|entry" -> due ms)
    KEYS[20]     overloadedKey  overloaded devices set
    KEYS[21]     callerKey      caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now            now (ms)
    ARGV[2]      token          lock token
    ARGV[3]      mac            device (normalised MAC)
    ARGV[4]      delayBase      delay base (ms)
    ARGV[5]      delayCap       delay cap (ms)
    ARGV[6]      maxDefers      max defers of one task before it is dead-lettered
    ARGV[7]      reason         reason (recorded in dead letters)
    ARGV[8]      deadKeep       dead letters kept
    ARGV[9]      waitingTypes   types whose queued tasks wait too, comma separated
    ARGV[10]     maxPerDevice   per-device pending limit (the overloaded mark is cleared below it)
    ARGV[11..]   taken          ids of tasks leased in this dispatch to defer

  Output:
    {earliest due ms (0 when nothing waits), number of dead letters, dead-letter records (JSON)...,
     ids of the tasks that wait...}
    {LOCK_NOT_OWNED}  the lock is held by another token: nothing changed (codes: includes/codes.lua)
]]
--@requires codes, slice, deviceBlock, parseEntry, ownsLock, takeLease, returnTask, endDispatch, reschedule

local now = tonumber(ARGV[1])
local token = ARGV[2]
local mac = ARGV[3]
local delayBase = tonumber(ARGV[4])
local delayCap = tonumber(ARGV[5])
local maxDefers = tonumber(ARGV[6])
local reason = ARGV[7]
local deadKeep = tonumber(ARGV[8])
local waitingTypes = ARGV[9]
local maxPerDevice = tonumber(ARGV[10])
local taken = slice(ARGV, 11)
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local servingKey = KEYS[13]
local pendingKey = KEYS[14]
local leasesKey = KEYS[15]
local leaseDataKey = KEYS[16]
local deadKey = KEYS[17]
local devicesKey = KEYS[18]
local delayedKey = KEYS[19]
local overloadedKey = KEYS[20]
local callerKey = KEYS[21]

local _, owned = ownsLock(device, lockKey, token)
if not owned then
  return {CODE.LOCK_NOT_OWNED}
end

local way = {device = device, now = now, deadKey = deadKey, deadKeep = deadKeep, reason = reason,
             callerKey = callerKey, delayedKey = delayedKey}
local dead, waiting = {}, {}
local earliest = 0

local function defer(e)
  e.defers = e.defers + 1
  local delay = delayBase * (2 ^ (e.defers - 1))
  if delay > delayCap then delay = delayCap end
  local due = now + delay
  local went, record = returnTask(way, e, e.defers >= maxDefers, due)
  if went == "dead" then
    dead[#dead + 1] = record
    return
  end
  waiting[#waiting + 1] = e.id
  if earliest == 0 or due < earliest then earliest = due end
end

for _, id in ipairs(taken) do
  local e = takeLease(device, leasesKey, leaseDataKey, id, "*")
  if e then defer(e) end
end

-- the device's queued tasks of those types wait as well (one pass over each queue, order kept)
local types = {}
for t in string.gmatch(waitingTypes, "[^,]+") do types[t] = true end
local moved = 0
for p = 1, 5 do
  local key = device.queues[p]
  local items = redis.call("LRANGE", key, 0, -1)
  local keep, hit = {}, false
  for _, raw in ipairs(items) do
    local e = parseEntry(raw)
    if types[e.type] and e.exp > now then
      hit = true
      moved = moved + 1
      defer(e)
    else
      keep[#keep + 1] = raw
    end
  end
  if hit then
    redis.call("DEL", key)
    for j = 1, #keep, 1000 do
      redis.call("RPUSH", key, unpack(keep, j, math.min(j + 999, #keep)))
    end
  end
end
if moved > 0 then
  local backlog = redis.call("HINCRBY", device.meta, "backlog", -moved)
  redis.call("DECRBY", pendingKey, moved)
  if backlog < maxPerDevice then redis.call("SREM", overloadedKey, mac) end
end

endDispatch(device, lockKey, servingKey)
reschedule(device, now, devicesKey)

local out = {earliest, #dead}
for _, d in ipairs(dead) do out[#out + 1] = d end
for _, id in ipairs(waiting) do out[#out + 1] = id end
return out
