--[[
  Puts leased tasks of one device back at the front of its queues (a nack, a worker that went away,
  a lease that ran out). Counted attempts that reach max_attempts are dead-lettered instead. With a
  retry time in the future the tasks wait in the delayed set first; promoteDelayed puts them back at the
  front of their queue when it comes.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     global pending counter
    KEYS[13]     leases
    KEYS[14]     lease data
    KEYS[15]     dead-letter list
    KEYS[16]     active devices set
    KEYS[17]     delayed set ("mac|entry" -> due ms)
    KEYS[18]     caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now (ms)
    ARGV[2]      device (normalised MAC)
    ARGV[3]      1 when the attempt counts as a failure, 0 when it does not (the worker's own state, a
                 shutdown); either way the next hand-out gets a new attempt number
    ARGV[4]      max attempts
    ARGV[5]      reason (recorded in dead letters)
    ARGV[6]      dead letters kept
    ARGV[7]      retry at (ms); at or before now means at once
    ARGV[8..]    pairs: task_id, attempt ("*" for whatever attempt holds the lease), in dispatch order

  Output:
    {requeued at once, n, dead-letter records (JSON) x n, ids of the other tasks whose lease was taken...}
    (requeued at once or delayed; a pair whose lease was not there, or is another attempt's, is in neither)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "deadLetter"
--- @include "countOutstanding"
--- @include "takeLease"
--- @include "settleReturned"
--- @include "countCaller"
--- @include "forgetIdle"

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local counts = ARGV[3] == "1"
local out = {0, 0}
local taken = {}
local back = 0
local retryAt = tonumber(ARGV[7])
for i = #ARGV - 1, 8, -2 do
  local e = takeLease(KEYS[13], KEYS[14], mac, ARGV[i], ARGV[i + 1])
  if e then
    if counts then e.failures = e.failures + 1 end
    if counts and e.failures >= tonumber(ARGV[4]) then
      out[#out + 1] = deadLetter(KEYS[15], tonumber(ARGV[6]), mac, e, ARGV[5], now)
      countCaller(KEYS[18], e, -1)
    elseif retryAt > now then
      redis.call("ZADD", KEYS[17], retryAt, mac .. "|" .. encodeEntry(e))
      countOutstanding(KEYS[1], 1)
      taken[#taken + 1] = e.id
    else
      redis.call("LPUSH", KEYS[1 + e.prio], encodeEntry(e))
      back = back + 1
      taken[#taken + 1] = e.id
    end
  end
end
settleReturned(mac, back, KEYS[12], KEYS[16], now)
forgetIdle(KEYS[1])
out[1] = back
out[2] = #out - 2
for _, id in ipairs(taken) do out[#out + 1] = id end
return out
