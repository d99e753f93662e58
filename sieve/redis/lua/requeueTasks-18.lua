--[[
  Puts leased tasks of one device back at the front of its queues (a nack, a worker that went away,
  a lease that ran out). Counted attempts that reach max_attempts are dead-lettered instead. With a
  retry time in the future the tasks wait in the delayed set first; promoteDelayed puts them back at the
  front of their queue when it comes.

  Input:
    KEYS[1..11]  device        device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     pendingKey    global pending counter
    KEYS[13]     leasesKey     leases
    KEYS[14]     leaseDataKey  lease data
    KEYS[15]     deadKey       dead-letter list
    KEYS[16]     devicesKey    active devices set
    KEYS[17]     delayedKey    delayed set ("mac|entry" -> due ms)
    KEYS[18]     callerKey     caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now           now (ms)
    ARGV[2]      mac           device (normalised MAC)
    ARGV[3]      counts        1 when the attempt counts as a failure, 0 when it does not (the worker's own state,
                               a shutdown); either way the next hand-out gets a new attempt number
    ARGV[4]      maxAttempts   max attempts
    ARGV[5]      reason        reason (recorded in dead letters)
    ARGV[6]      deadKeep      dead letters kept
    ARGV[7]      retryAt       retry at (ms); at or before now means at once
    ARGV[8..]    leases        pairs: task_id, attempt ("*" for whatever attempt holds the lease), in dispatch order

  Output:
    {requeued at once, n, dead-letter records (JSON) x n, ids of the other tasks whose lease was taken...}
    (requeued at once or delayed; a pair whose lease was not there, or is another attempt's, is in neither)
]]
--@requires slice, deviceBlock, takeLease, returnTask, settleReturned, forgetIdle

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local counts = ARGV[3] == "1"
local maxAttempts = tonumber(ARGV[4])
local reason = ARGV[5]
local deadKeep = tonumber(ARGV[6])
local retryAt = tonumber(ARGV[7])
local leases = slice(ARGV, 8)
local device = deviceBlock(KEYS, mac)
local pendingKey = KEYS[12]
local leasesKey = KEYS[13]
local leaseDataKey = KEYS[14]
local deadKey = KEYS[15]
local devicesKey = KEYS[16]
local delayedKey = KEYS[17]
local callerKey = KEYS[18]

local way = {device = device, now = now, deadKey = deadKey, deadKeep = deadKeep, reason = reason,
             callerKey = callerKey, delayedKey = delayedKey}
local out = {0, 0}
local taken = {}
local back = 0
for i = #leases - 1, 1, -2 do
  local e = takeLease(device, leasesKey, leaseDataKey, leases[i], leases[i + 1])
  if e then
    if counts then e.failures = e.failures + 1 end
    local went, record = returnTask(way, e, counts and e.failures >= maxAttempts, retryAt > now and retryAt)
    if went == "dead" then
      out[#out + 1] = record
    else
      if went == "back" then back = back + 1 end
      taken[#taken + 1] = e.id
    end
  end
end
settleReturned(device, back, pendingKey, devicesKey, now)
forgetIdle(device.meta)
out[1] = back
out[2] = #out - 2
for _, id in ipairs(taken) do out[#out + 1] = id end
return out
