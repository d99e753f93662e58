--[[
  Claims a device for serving and takes up to n tasks from it, in one atomic step.

  Takes the device's dispatch lock (SET NX PX with the caller's token), moves the device from its
  schedule set to the serving set, then pops: the highest priority first, except that a head task that
  has waited max_wait or longer is taken before any younger one (low priority never starves). Expired
  tasks are dropped on the way (the caller records them EXPIRED). Each popped task's attempt is raised
  and it is leased until now + lease_ttl; the new attempt number is its fencing token.

  Popping stops before a task whose type is not in the allowed list (no connected worker has room for
  it): the caller then backs the device off or serves it later. With release=1 the dispatch ends in the
  same step (lock dropped, device rescheduled with its wait restarting now), which is what a dispatcher
  does when every task it took has a worker waiting for it.

  Input:
    KEYS[1..11]  device         device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey        device dispatch lock
    KEYS[13]     pendingKey     global pending counter
    KEYS[14]     servingKey     serving set
    KEYS[15]     leasesKey      leases (task_id -> deadline ms)
    KEYS[16]     leaseDataKey   lease data (task_id -> "mac|entry")
    KEYS[17]     overloadedKey  overloaded devices set
    KEYS[18]     devicesKey     active devices set
    KEYS[19]     callerKey      caller counts (caller -> open tasks; an expired task dropped here is no longer open)

    ARGV[1]      now            now (ms)
    ARGV[2]      token          lock token
    ARGV[3]      lockTtl        lock ttl (ms)
    ARGV[4]      want           most tasks to take
    ARGV[5]      maxWait        max_wait (ms)
    ARGV[6]      leaseTtl       lease ttl (ms)
    ARGV[7]      mac            device (normalised MAC)
    ARGV[8]      maxPerDevice   per-device pending limit (the overloaded mark is cleared below it)
    ARGV[9]      allowedTypes   allowed task types, comma separated ("" for any)
    ARGV[10]     release        1 to release the device in the same step, 0 to keep it locked for releaseDevice
    ARGV[11]     carriedWait    wait carried over (ms): the device's wait restarts at now - this (see rankDevices)

  Output:
    {OK, taken, blocked, e1..e_taken, x1..x_m}
                                       entries taken (attempt raised), then entries dropped as expired;
                                       blocked = 1 when popping stopped at a task of a type not allowed
    {LOCK_HELD}                        the device's lock is already held (by another dispatch)
    {DEVICE_NOT_READY}                 the device is not schedulable (taken by another replica, idle, backoff)
    (codes: includes/codes.lua)
]]
--@requires codes, deviceBlock, parseEntry, countCaller, countOutstanding, endDispatch, reschedule

local now = tonumber(ARGV[1])
local token = ARGV[2]
local lockTtl = ARGV[3]
local want = tonumber(ARGV[4])
local maxWait = tonumber(ARGV[5])
local leaseTtl = tonumber(ARGV[6])
local mac = ARGV[7]
local maxPerDevice = tonumber(ARGV[8])
local allowedTypes = ARGV[9]
local release = ARGV[10] == "1"
local carriedWait = tonumber(ARGV[11] or "0")
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local pendingKey = KEYS[13]
local servingKey = KEYS[14]
local leasesKey = KEYS[15]
local leaseDataKey = KEYS[16]
local overloadedKey = KEYS[17]
local devicesKey = KEYS[18]
local callerKey = KEYS[19]

if not redis.call("SET", lockKey, token, "NX", "PX", lockTtl) then
  return {CODE.LOCK_HELD}
end
if redis.call("HGET", device.meta, "state") ~= "ready" then
  redis.call("DEL", lockKey)
  if redis.call("EXISTS", device.meta) == 0 then
    -- no meta at all (its keys were lost): out of the schedule sets, or the next rank picks it again and the
    -- dispatcher spins on it; the reconciler repairs the device and schedules it again
    for p = 1, 5 do redis.call("ZREM", device.schedules[p], mac) end
  end
  return {CODE.DEVICE_NOT_READY}
end
local class = tonumber(redis.call("HGET", device.meta, "class") or "0")
if class > 0 then redis.call("ZREM", device.schedules[class], mac) end
redis.call("ZADD", servingKey, now + tonumber(lockTtl), mac)
redis.call("HSET", device.meta, "state", "serving", "class", 0, "token", token,
  "last_served_ms", now - carriedWait)

-- the device's non-empty queues, highest priority first
local sizes = {}
for p = 5, 1, -1 do
  sizes[p] = redis.call("LLEN", device.queues[p])
end

local function nextQueue()
  local agedAt, agedPrio, best, nonEmpty = false, 0, 0, 0
  for p = 5, 1, -1 do
    if sizes[p] > 0 then
      nonEmpty = nonEmpty + 1
      if best == 0 then best = p end
    end
  end
  if nonEmpty <= 1 then return best end
  for p = 5, 1, -1 do
    if sizes[p] > 0 then
      local e = parseEntry(redis.call("LINDEX", device.queues[p], 0))
      if now - e.enq >= maxWait and ((not agedAt) or e.enq < agedAt) then
        agedAt, agedPrio = e.enq, p
      end
    end
  end
  if agedPrio > 0 then return agedPrio end
  return best
end

local allowed = nil
if allowedTypes ~= "" then
  allowed = {}
  for t in string.gmatch(allowedTypes, "[^,]+") do allowed[t] = true end
end

local taken, expired = {}, {}
local leaseArgs, dataArgs = {}, {}
local blocked = 0
local leaseUntil = now + leaseTtl
while #taken < want do
  local p = nextQueue()
  if p == 0 then break end
  local raw = redis.call("LINDEX", device.queues[p], 0)
  local e = parseEntry(raw)
  if e.exp > now and allowed and not allowed[e.type] then
    blocked = 1
    break
  end
  redis.call("LPOP", device.queues[p])
  sizes[p] = sizes[p] - 1
  if e.exp <= now then
    expired[#expired + 1] = raw
    countCaller(callerKey, e, -1)
  else
    e.attempt = e.attempt + 1
    local leased = encodeEntry(e)
    leaseArgs[#leaseArgs + 1] = leaseUntil
    leaseArgs[#leaseArgs + 1] = e.id
    dataArgs[#dataArgs + 1] = e.id
    dataArgs[#dataArgs + 1] = mac .. "|" .. leased
    taken[#taken + 1] = leased
  end
end
if #taken > 0 then
  redis.call("ZADD", leasesKey, unpack(leaseArgs))
  redis.call("HSET", leaseDataKey, unpack(dataArgs))
  countOutstanding(device.meta, #taken)
end

local removed = #taken + #expired
if removed > 0 then
  local backlog = redis.call("HINCRBY", device.meta, "backlog", -removed)
  redis.call("DECRBY", pendingKey, removed)
  if backlog < maxPerDevice then redis.call("SREM", overloadedKey, mac) end
  redis.call("HINCRBY", device.meta, "served", #taken)
end
-- service rate, for the retry delay intake gives a refused device: tasks taken per 10 s window
local winStart = tonumber(redis.call("HGET", device.meta, "win_start_ms") or "0")
if now - winStart >= 10000 then
  if winStart > 0 then
    local count = tonumber(redis.call("HGET", device.meta, "win_count") or "0")
    redis.call("HSET", device.meta, "rate_per_s", string.format("%.3f", count * 1000 / (now - winStart)))
  end
  redis.call("HSET", device.meta, "win_start_ms", now, "win_count", 0)
end
redis.call("HINCRBY", device.meta, "win_count", #taken)

if release then
  endDispatch(device, lockKey, servingKey)
  if #taken > 0 then redis.call("HSET", device.meta, "defer_count", 0) end
  reschedule(device, now, devicesKey)
end

local out = {CODE.OK, #taken, blocked}
for _, v in ipairs(taken) do out[#out + 1] = v end
for _, v in ipairs(expired) do out[#out + 1] = v end
return out
