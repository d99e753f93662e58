--[[
  A device's tasks of some types cannot be served now (no live worker takes their type, or GPU workers are
  expected and none is alive): those tasks wait, the device does not. The tasks taken in this dispatch and
  every task of those types still queued for the device move to the delayed set, each for
  min(base x 2^(d-1), max) where d is its own defer count (raised here); a task deferred max_defers times is
  dead-lettered instead. Then the device is released and scheduled again for what it has left (its other
  types keep flowing); promoteDelayed brings the deferred tasks back to the front of their queues when due.
  Tasks already past their TTL stay queued (the next pop drops them as expired).

  Input:
    KEYS[1..11]  device block
    KEYS[12]     device dispatch lock
    KEYS[13]     serving set
    KEYS[14]     global pending counter
    KEYS[15]     leases
    KEYS[16]     lease data
    KEYS[17]     dead-letter list
    KEYS[18]     active devices set
    KEYS[19]     delayed set ("mac|entry" -> due ms)
    KEYS[20]     overloaded devices set
    KEYS[21]     caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now (ms)
    ARGV[2]      lock token
    ARGV[3]      device (normalised MAC)
    ARGV[4]      delay base (ms)
    ARGV[5]      delay cap (ms)
    ARGV[6]      max defers of one task before it is dead-lettered
    ARGV[7]      reason (recorded in dead letters)
    ARGV[8]      dead letters kept
    ARGV[9]      types whose queued tasks wait too, comma separated
    ARGV[10]     per-device pending limit (the overloaded mark is cleared below it)
    ARGV[11..]   ids of tasks leased in this dispatch to defer

  Output:
    {earliest due ms (0 when nothing waits), number of dead letters, dead-letter records (JSON)...,
     ids of the tasks that wait...}
    {-6}  the lock is held by another token: nothing changed
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "deadLetter"
--- @include "countOutstanding"
--- @include "takeLease"
--- @include "ownsLock"
--- @include "countCaller"

local now = tonumber(ARGV[1])
local mac = ARGV[3]
local holder, owned = ownsLock(KEYS[12], ARGV[2])
if not owned then
  return {-6}
end

local base, cap, maxDefers = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local dead, waiting = {}, {}
local earliest = 0

local function defer(e)
  e.defers = e.defers + 1
  if e.defers >= maxDefers then
    dead[#dead + 1] = deadLetter(KEYS[17], tonumber(ARGV[8]), mac, e, ARGV[7], now)
    countCaller(KEYS[21], e, -1)
    return
  end
  local delay = base * (2 ^ (e.defers - 1))
  if delay > cap then delay = cap end
  local due = now + delay
  redis.call("ZADD", KEYS[19], due, mac .. "|" .. encodeEntry(e))
  countOutstanding(KEYS[1], 1)
  waiting[#waiting + 1] = e.id
  if earliest == 0 or due < earliest then earliest = due end
end

for i = 11, #ARGV do
  local e = takeLease(KEYS[15], KEYS[16], mac, ARGV[i], "*")
  if e then defer(e) end
end

-- the device's queued tasks of those types wait as well (one pass over each queue, order kept)
local types = {}
for t in string.gmatch(ARGV[9], "[^,]+") do types[t] = true end
local moved = 0
for p = 1, 5 do
  local key = KEYS[1 + p]
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
  local backlog = redis.call("HINCRBY", KEYS[1], "backlog", -moved)
  redis.call("DECRBY", KEYS[14], moved)
  if backlog < tonumber(ARGV[10]) then redis.call("SREM", KEYS[20], mac) end
end

if holder then redis.call("DEL", KEYS[12]) end
redis.call("ZREM", KEYS[13], mac)
redis.call("HDEL", KEYS[1], "token")
if scheduleDevice(mac, now) == "idle" then redis.call("SREM", KEYS[18], mac) end

local out = {earliest, #dead}
for _, d in ipairs(dead) do out[#out + 1] = d end
for _, id in ipairs(waiting) do out[#out + 1] = id end
return out
