--[[
  Backs a device off because it cannot be served now (e.g. no live worker takes its task type), putting
  the tasks taken in this dispatch back at the front of its queues. The device is skipped until
  unschedulable_until = now + min(base x 2^(n-1), max) and resumed by resumeDevice. A task put back
  max_defers times is dead-lettered instead.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     device dispatch lock
    KEYS[13]     serving set
    KEYS[14]     backoff set
    KEYS[15]     global pending counter
    KEYS[16]     leases
    KEYS[17]     lease data
    KEYS[18]     dead-letter list
    KEYS[19]     active devices set
    KEYS[20]     caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now (ms)
    ARGV[2]      lock token
    ARGV[3]      device (normalised MAC)
    ARGV[4]      backoff base (ms)
    ARGV[5]      backoff cap (ms)
    ARGV[6]      max defers of one task before it is dead-lettered
    ARGV[7]      reason (recorded in dead letters)
    ARGV[8]      dead letters kept
    ARGV[9..]    ids of tasks leased in this dispatch to put back, in the order they were taken

  Output:
    {unschedulable_until ms (0 when the device had nothing left), dead-letter records (JSON)...}
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

local out = {0}
local back = 0
for i = #ARGV, 9, -1 do
  local e = takeLease(KEYS[16], KEYS[17], mac, ARGV[i], "*")
  if e then
    e.defers = e.defers + 1
    if e.defers >= tonumber(ARGV[6]) then
      out[#out + 1] = deadLetter(KEYS[18], tonumber(ARGV[8]), mac, e, ARGV[7], now)
      countCaller(KEYS[20], e, -1)
    else
      redis.call("LPUSH", KEYS[1 + e.prio], encodeEntry(e))
      back = back + 1
    end
  end
end
if back > 0 then
  redis.call("HINCRBY", KEYS[1], "backlog", back)
  redis.call("INCRBY", KEYS[15], back)
end

if holder then redis.call("DEL", KEYS[12]) end
redis.call("ZREM", KEYS[13], mac)
redis.call("HDEL", KEYS[1], "token")
local oldest = deviceHeads()
if not oldest then
  scheduleDevice(mac, now)
  redis.call("SREM", KEYS[19], mac)
  return out
end
local n = redis.call("HINCRBY", KEYS[1], "defer_count", 1)
local delay = tonumber(ARGV[4]) * (2 ^ (n - 1))
if delay > tonumber(ARGV[5]) then delay = tonumber(ARGV[5]) end
local untilMs = now + delay
redis.call("HSET", KEYS[1], "state", "backoff", "class", 0, "unschedulable_until_ms", untilMs,
  "defer_reason", ARGV[7])
redis.call("ZADD", KEYS[14], untilMs, mac)
out[1] = untilMs
return out
