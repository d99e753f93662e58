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
    KEYS[1..11]  device block (meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     device dispatch lock
    KEYS[13]     global pending counter
    KEYS[14]     serving set
    KEYS[15]     leases (task_id -> deadline ms)
    KEYS[16]     lease data (task_id -> "mac|entry")
    KEYS[17]     overloaded devices set
    KEYS[18]     active devices set
    KEYS[19]     caller counts (caller -> open tasks; an expired task dropped here is no longer open)

    ARGV[1]      now (ms)
    ARGV[2]      lock token
    ARGV[3]      lock ttl (ms)
    ARGV[4]      most tasks to take
    ARGV[5]      max_wait (ms)
    ARGV[6]      lease ttl (ms)
    ARGV[7]      device (normalised MAC)
    ARGV[8]      per-device pending limit (the overloaded mark is cleared below it)
    ARGV[9]      allowed task types, comma separated ("" for any)
    ARGV[10]     1 to release the device in the same step, 0 to keep it locked for releaseDevice
    ARGV[11]     wait carried over (ms): the device's wait restarts at now - this (see rankDevices)

  Output:
    {1, taken, blocked, e1..e_taken, x1..x_m}
                                       entries taken (attempt raised), then entries dropped as expired;
                                       blocked = 1 when popping stopped at a task of a type not allowed
    {-2}                               another holder has the device's lock
    {-3}                               the device is not schedulable (taken by another replica, idle, backoff)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "countCaller"
--- @include "countOutstanding"

local now = tonumber(ARGV[1])
local mac = ARGV[7]
local maxWait = tonumber(ARGV[5])

if not redis.call("SET", KEYS[12], ARGV[2], "NX", "PX", ARGV[3]) then
  return {-2}
end
if redis.call("HGET", KEYS[1], "state") ~= "ready" then
  redis.call("DEL", KEYS[12])
  if redis.call("EXISTS", KEYS[1]) == 0 then
    -- no meta at all (its keys were lost): out of the schedule sets, or the next rank picks it again and the
    -- dispatcher spins on it; the reconciler repairs the device and schedules it again
    for i = 7, 11 do redis.call("ZREM", KEYS[i], mac) end
  end
  return {-3}
end
local class = tonumber(redis.call("HGET", KEYS[1], "class") or "0")
if class > 0 then redis.call("ZREM", KEYS[6 + class], mac) end
redis.call("ZADD", KEYS[14], now + tonumber(ARGV[3]), mac)
redis.call("HSET", KEYS[1], "state", "serving", "class", 0, "token", ARGV[2],
  "last_served_ms", now - tonumber(ARGV[11] or "0"))

-- the device's non-empty queues, highest priority first
local sizes = {}
for p = 5, 1, -1 do
  sizes[p] = redis.call("LLEN", KEYS[1 + p])
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
      local e = parseEntry(redis.call("LINDEX", KEYS[1 + p], 0))
      if now - e.enq >= maxWait and ((not agedAt) or e.enq < agedAt) then
        agedAt, agedPrio = e.enq, p
      end
    end
  end
  if agedPrio > 0 then return agedPrio end
  return best
end

local allowed = nil
if ARGV[9] ~= "" then
  allowed = {}
  for t in string.gmatch(ARGV[9], "[^,]+") do allowed[t] = true end
end

local taken, expired = {}, {}
local leaseArgs, dataArgs = {}, {}
local blocked = 0
local want = tonumber(ARGV[4])
local leaseUntil = now + tonumber(ARGV[6])
while #taken < want do
  local p = nextQueue()
  if p == 0 then break end
  local raw = redis.call("LINDEX", KEYS[1 + p], 0)
  local e = parseEntry(raw)
  if e.exp > now and allowed and not allowed[e.type] then
    blocked = 1
    break
  end
  redis.call("LPOP", KEYS[1 + p])
  sizes[p] = sizes[p] - 1
  if e.exp <= now then
    expired[#expired + 1] = raw
    countCaller(KEYS[19], e, -1)
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
  redis.call("ZADD", KEYS[15], unpack(leaseArgs))
  redis.call("HSET", KEYS[16], unpack(dataArgs))
  countOutstanding(KEYS[1], #taken)
end

local removed = #taken + #expired
if removed > 0 then
  local backlog = redis.call("HINCRBY", KEYS[1], "backlog", -removed)
  redis.call("DECRBY", KEYS[13], removed)
  if backlog < tonumber(ARGV[8]) then redis.call("SREM", KEYS[17], mac) end
  redis.call("HINCRBY", KEYS[1], "served", #taken)
end
-- service rate, for the retry delay intake gives a refused device: tasks taken per 10 s window
local winStart = tonumber(redis.call("HGET", KEYS[1], "win_start_ms") or "0")
if now - winStart >= 10000 then
  if winStart > 0 then
    local count = tonumber(redis.call("HGET", KEYS[1], "win_count") or "0")
    redis.call("HSET", KEYS[1], "rate_per_s", string.format("%.3f", count * 1000 / (now - winStart)))
  end
  redis.call("HSET", KEYS[1], "win_start_ms", now, "win_count", 0)
end
redis.call("HINCRBY", KEYS[1], "win_count", #taken)

if ARGV[10] == "1" then
  redis.call("DEL", KEYS[12])
  redis.call("ZREM", KEYS[14], mac)
  redis.call("HDEL", KEYS[1], "token")
  if #taken > 0 then redis.call("HSET", KEYS[1], "defer_count", 0) end
  if scheduleDevice(mac, now) == "idle" then redis.call("SREM", KEYS[18], mac) end
end

local out = {1, #taken, blocked}
for _, v in ipairs(taken) do out[#out + 1] = v end
for _, v in ipairs(expired) do out[#out + 1] = v end
return out
