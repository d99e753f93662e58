--[[
  Backs a device off because it cannot be served now (e.g. no live worker takes its task type), putting
  the tasks taken in this dispatch back at the front of its queues. The device is skipped until
  unschedulable_until = now + min(base x 2^(n-1), max) and resumed by resumeDevice. A task put back
  max_defers times is dead-lettered instead.

  Input:
    KEYS[1..11]  device        device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey       device dispatch lock
    KEYS[13]     servingKey    serving set
    KEYS[14]     backoffKey    backoff set
    KEYS[15]     pendingKey    global pending counter
    KEYS[16]     leasesKey     leases
    KEYS[17]     leaseDataKey  lease data
    KEYS[18]     deadKey       dead-letter list
    KEYS[19]     devicesKey    active devices set
    KEYS[20]     callerKey     caller counts (caller -> open tasks; a dead-lettered task is no longer open)

    ARGV[1]      now           now (ms)
    ARGV[2]      token         lock token
    ARGV[3]      mac           device (normalised MAC)
    ARGV[4]      backoffBase   backoff base (ms)
    ARGV[5]      backoffCap    backoff cap (ms)
    ARGV[6]      maxDefers     max defers of one task before it is dead-lettered
    ARGV[7]      reason        reason (recorded in dead letters)
    ARGV[8]      deadKeep      dead letters kept
    ARGV[9..]    taken         ids of tasks leased in this dispatch to put back, in the order they were taken

  Output:
    {unschedulable_until ms (0 when the device had nothing left), dead-letter records (JSON)...}
    {LOCK_NOT_OWNED}  the lock is held by another token: nothing changed (codes: includes/codes.lua)
]]
--@requires codes, slice, deviceBlock, ownsLock, takeLease, returnTask, countBack, endDispatch, deviceHeads
--@requires reschedule

local now = tonumber(ARGV[1])
local token = ARGV[2]
local mac = ARGV[3]
local backoffBase = tonumber(ARGV[4])
local backoffCap = tonumber(ARGV[5])
local maxDefers = tonumber(ARGV[6])
local reason = ARGV[7]
local deadKeep = tonumber(ARGV[8])
local taken = slice(ARGV, 9)
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local servingKey = KEYS[13]
local backoffKey = KEYS[14]
local pendingKey = KEYS[15]
local leasesKey = KEYS[16]
local leaseDataKey = KEYS[17]
local deadKey = KEYS[18]
local devicesKey = KEYS[19]
local callerKey = KEYS[20]

local _, owned = ownsLock(device, lockKey, token)
if not owned then
  return {CODE.LOCK_NOT_OWNED}
end

local way = {device = device, now = now, deadKey = deadKey, deadKeep = deadKeep, reason = reason,
             callerKey = callerKey}
local out = {0}
local back = 0
for i = #taken, 1, -1 do
  local e = takeLease(device, leasesKey, leaseDataKey, taken[i], "*")
  if e then
    e.defers = e.defers + 1
    local went, record = returnTask(way, e, e.defers >= maxDefers, false)
    if went == "dead" then out[#out + 1] = record else back = back + 1 end
  end
end
countBack(device, back, pendingKey)

endDispatch(device, lockKey, servingKey)
if not deviceHeads(device) then
  reschedule(device, now, devicesKey)
  return out
end
local n = redis.call("HINCRBY", device.meta, "defer_count", 1)
local delay = backoffBase * (2 ^ (n - 1))
if delay > backoffCap then delay = backoffCap end
local untilMs = now + delay
redis.call("HSET", device.meta, "state", "backoff", "class", 0, "unschedulable_until_ms", untilMs,
  "defer_reason", reason)
redis.call("ZADD", backoffKey, untilMs, mac)
out[1] = untilMs
return out
