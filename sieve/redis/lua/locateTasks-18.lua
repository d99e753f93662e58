--[[
  Where some open tasks of one device are in Redis, and whether the device's own keys agree; read-only (the
  reconciler's look: scheduler_svc/reconcile.py).

  Reads the device's five queues once, then looks each task id up: queued, leased (lease data, with a deadline)
  or neither. With exact=0 the delayed set is not searched: the caller leaves out the ids of its own snapshot of
  the delayed set and confirms the rest with exact=1, which also searches the delayed set (ZSCAN of this
  device's members), so that an id it calls missing was in none of the three places at one instant.

  Input:
    KEYS[1..11]  device        device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey       device dispatch lock
    KEYS[13]     servingKey    serving set
    KEYS[14]     backoffKey    backoff set
    KEYS[15]     leasesKey     leases (task_id -> deadline ms)
    KEYS[16]     leaseDataKey  lease data (task_id -> "mac|entry")
    KEYS[17]     delayedKey    delayed set ("mac|entry" -> due ms)
    KEYS[18]     devicesKey    active devices set

    ARGV[1]      mac           device (normalised MAC)
    ARGV[2]      exact         1: search the delayed set too; 0: do not
    ARGV[3..]    taskIds       task ids

  Output:
    {queued, backlog, problem, m, u, d, missing ids (m)..., unleased ids (u)..., duplicated ids (d)...}
    queued: entries in the device's queues; backlog: its meta's count; problem: "" or what deviceFacts found;
    missing: in no queue, no lease (nor, with exact=1, the delayed set); unleased: lease data without a deadline
    (such a lease would never be taken back); duplicated: queued twice, or queued and leased
]]
--@requires slice, deviceBlock, deviceFacts

local mac = ARGV[1]
local exact = ARGV[2] == "1"
local taskIds = slice(ARGV, 3)
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local servingKey = KEYS[13]
local backoffKey = KEYS[14]
local leasesKey = KEYS[15]
local leaseDataKey = KEYS[16]
local delayedKey = KEYS[17]
local devicesKey = KEYS[18]

local queuedIds, twice = {}, {}
for p = 1, 5 do
  for _, raw in ipairs(redis.call("LRANGE", device.queues[p], 0, -1)) do
    local id = string.match(raw, "^[^|]*")
    if queuedIds[id] then twice[id] = true end
    queuedIds[id] = true
  end
end

local missing, unleased, duplicated = {}, {}, {}
local lost = {}
for _, id in ipairs(taskIds) do
  local leased = redis.call("HEXISTS", leaseDataKey, id) == 1
  if queuedIds[id] then
    if twice[id] or leased then duplicated[#duplicated + 1] = id end
  elseif leased then
    if not redis.call("ZSCORE", leasesKey, id) then unleased[#unleased + 1] = id end
  else
    lost[id] = true
    missing[#missing + 1] = id
  end
end

if exact and #missing > 0 then
  local prefix = mac .. "|"
  local pattern = string.gsub(mac, "[%*%?%[%]\\]", "\\%0") .. "|*"
  local cursor = "0"
  repeat
    local page = redis.call("ZSCAN", delayedKey, cursor, "MATCH", pattern, "COUNT", 1000)
    cursor = page[1]
    for j = 1, #page[2], 2 do
      local member = page[2][j]
      if string.sub(member, 1, #prefix) == prefix then
        lost[string.match(string.sub(member, #prefix + 1), "^[^|]*")] = nil
      end
    end
  until cursor == "0"
  local still = {}
  for _, id in ipairs(missing) do
    if lost[id] then still[#still + 1] = id end
  end
  missing = still
end

local queued, backlog, _, problem = deviceFacts(device, lockKey, servingKey, backoffKey, devicesKey)
local out = {queued, backlog, problem, #missing, #unleased, #duplicated}
for _, id in ipairs(missing) do out[#out + 1] = id end
for _, id in ipairs(unleased) do out[#out + 1] = id end
for _, id in ipairs(duplicated) do out[#out + 1] = id end
return out
