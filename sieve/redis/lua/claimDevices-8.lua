--[[
  Claims the next devices of the fair order and takes their tasks, in one atomic step: what popBatch does for
  one device, repeated for the device rankNext names next, until `want` tasks are taken, `maxDevices` devices
  were claimed, the budget is spent, no device is schedulable, or a device already claimed in this call is named
  again. Every device is claimed and released on its own (its own lock token, its wait restarting as it is
  served), in the order one claim at a time would take them, so a fleet of devices with a task each costs one
  round trip per batch instead of one per device. A device gives at most one batch per call: the rest of the
  credits wait for the next call, in which a device that became ready meanwhile (a newcomer behind a device with
  a long backlog) competes at once, instead of after the workers have gone through all one call handed out.
  A newcomer's first serve takes min_batch_size tasks (popDevice's firstWant) and does not count as its batch: it
  may be named again in the same call for the rest. Two hundred devices that arrive together behind a busy one
  all get their first hand-out within two hundred credits, not a thousand (new flows first, as in FQ-CoDel).

  Time runs on inside the call as it would between separate claims: each claim happens msPerTask ms per task
  taken so far after `now` (at least 0.01 ms after the one before), about when the workers would have taken
  those tasks, so that a device served early in the call has waited longer by the next choice than one served
  late, and weights keep their meaning however many claims one call makes.

  Input:
    KEYS[1]      backoffKey     backoff set
    KEYS[2]      pendingKey     global pending counter
    KEYS[3]      servingKey     serving set
    KEYS[4]      leasesKey      leases (task_id -> deadline ms)
    KEYS[5]      leaseDataKey   lease data (task_id -> "mac|entry")
    KEYS[6]      overloadedKey  overloaded devices set
    KEYS[7]      devicesKey     active devices set
    KEYS[8]      callerKey      caller counts (caller -> open tasks)

    ARGV[1]      now            now (ms)
    ARGV[2]      token          lock token prefix (device i is locked with token .. ":" .. i)
    ARGV[3]      lockTtl        lock ttl (ms)
    ARGV[4]      want           most tasks to take in all
    ARGV[5]      perDevice      most tasks to take from one device (batch_size)
    ARGV[6]      minBatch       most tasks from one device while another waited past the hint, and from a
                                device at its first serve since it became active (min_batch_size)
    ARGV[7]      maxWait        max_wait (ms)
    ARGV[8]      hint           starvation hint (ms)
    ARGV[9]      leaseTtl       lease ttl (ms)
    ARGV[10]     maxPerDevice   per-device pending limit (the overloaded mark is cleared below it)
    ARGV[11]     budgetText     tasks that may be taken per type: "type:n,..." ("" any, "-" none)
    ARGV[12]     carryMax       most wait (ms) a served device keeps of what it waited past its runner-up
    ARGV[13]     maxDevices     most devices to claim
    ARGV[14]     classesText    every schedule set's "priority:weight", comma separated
    ARGV[15]     callerWeightsText every caller weight in use, comma separated
    ARGV[16]     base           the keys' hash tag ("{prefix}"): device keys are named from it (deviceKeys)
    ARGV[17]     msPerTask      how long the workers take per task, about (ms): the clock of the call, and what
                                a task is worth to its caller's virtual start (callerGroup)
    ARGV[18..]   groupCaps      optional, with several shards: pairs of caller group, most tasks its devices may
                                give in this call (the group's part of the round in this shard: QueueStore.
                                shard_shares); a group at its cap gives way to the next in the fair order, a
                                group not named has no cap. None: no cap (one shard)

  Output:
    {OK, n, [mac, code, taken, expired, blocked, e1..e_taken, x1..x_expired] x n,
     then the next choice as rankDevices returns it: mac, group, starving, next backoff, longest, wait,
     weight, runner}
    code per device: OK, LOCK_HELD or DEVICE_NOT_READY (nothing taken); blocked: the type popping stopped at
    because its budget was spent or it was not allowed, or 0.
    (codes: includes/codes.lua)
]]
--@requires codes, slice, deviceBlock, rankNext, popDevice

local now = tonumber(ARGV[1])
local token = ARGV[2]
local lockTtl = ARGV[3]
local want = tonumber(ARGV[4])
local perDevice = tonumber(ARGV[5])
local minBatch = tonumber(ARGV[6])
local maxWait = tonumber(ARGV[7])
local hint = tonumber(ARGV[8])
local leaseTtl = tonumber(ARGV[9])
local maxPerDevice = tonumber(ARGV[10])
local budgetText = ARGV[11]
local carryMax = tonumber(ARGV[12])
local maxDevices = tonumber(ARGV[13])
local classesText = ARGV[14]
local callerWeightsText = ARGV[15]
local base = ARGV[16]
local msPerTask = tonumber(ARGV[17])
local groupCaps = slice(ARGV, 18)
local backoffKey = KEYS[1]
local pendingKey = KEYS[2]
local servingKey = KEYS[3]
local leasesKey = KEYS[4]
local leaseDataKey = KEYS[5]
local overloadedKey = KEYS[6]
local devicesKey = KEYS[7]
local callerKey = KEYS[8]
local g = {pending = pendingKey, serving = servingKey, leases = leasesKey, leaseData = leaseDataKey,
           overloaded = overloadedKey, devices = devicesKey, caller = callerKey}

local STEP = 0.01 -- the least time between two claims of one call (ms)
local ctx = rankContext(base, now, maxWait, hint, classesText, callerWeightsText)
ctx.empty = {} -- schedule sets found empty in this call (rankNext): nothing enters one but a device served here
-- what each capped caller group may still give in this call (rankNext passes over a group at 0)
local groupLeft = nil
if #groupCaps > 0 then
  groupLeft = {}
  for i = 1, #groupCaps - 1, 2 do groupLeft[groupCaps[i]] = tonumber(groupCaps[i + 1]) end
  ctx.groupLeft = groupLeft
  ctx.groupHeads = 2 + #groupCaps / 2
end
local budget = parseBudget(budgetText)

local function spent()
  if not budget then return false end
  for _, n in pairs(budget) do
    if n > 0 then return false end
  end
  return true
end

local out = {CODE.OK, 0}
local total, claimed, skip, at = 0, 0, "", now
local claimedOnce = {} -- devices claimed in this call: named again, they end it
local choice = rankNext(ctx, skip)
while choice.mac ~= "" and not claimedOnce[choice.mac] and total < want and claimed < maxDevices and not spent() do
  claimed = claimed + 1
  local mac = choice.mac
  local size = perDevice
  if choice.starving then size = minBatch end
  if size > want - total then size = want - total end
  if groupLeft and groupLeft[choice.group] and size > groupLeft[choice.group] then size = groupLeft[choice.group] end
  local carry = 0
  if choice.runner >= 0 and choice.weight > 0 then
    carry = choice.wait - choice.runner / choice.weight
    if carry < 0 then carry = 0 end
    if carry > carryMax then carry = carryMax end
  end
  local device = deviceBlock(deviceKeys(base, mac, choice.weight), mac, nil, nil, POP_FIELDS)
  local a = {now = at, token = token .. ":" .. claimed, lockTtl = lockTtl, want = size, maxWait = maxWait,
             leaseTtl = leaseTtl, maxPerDevice = maxPerDevice, budget = budget, release = true,
             carriedWait = carry, msPerTask = msPerTask, firstWant = minBatch}
  local code, taken, expired, blocked, tasted = popDevice(device, base .. ":lock:" .. mac, g, a)
  out[#out + 1] = mac
  out[#out + 1] = code
  out[#out + 1] = #taken
  out[#out + 1] = #expired
  out[#out + 1] = blocked
  for _, v in ipairs(taken) do out[#out + 1] = v end
  for _, v in ipairs(expired) do out[#out + 1] = v end
  out[2] = out[2] + 1
  total = total + #taken
  if groupLeft and groupLeft[choice.group] then groupLeft[choice.group] = groupLeft[choice.group] - #taken end
  -- (a newcomer's first taste does not count: named again in this call, it takes its batch)
  if not tasted then claimedOnce[mac] = true end
  -- a device served with tasks left is back in a schedule set, maybe one found empty before
  if device.rescheduled then ctx.empty = {} end
  -- under starvation (or when the device could not be claimed) it sits out the next choice: service spreads
  if choice.starving or code ~= CODE.OK then skip = mac else skip = "" end
  local step = #taken * msPerTask
  if step < STEP then step = STEP end
  at = at + step
  ctx.now = at
  choice = rankNext(ctx, skip)
end

flushCallerGroups()

-- the next choice is reported as the fair order has it, caps aside (what the round left is not what comes next)
if groupLeft then
  ctx.groupLeft = nil
  choice = rankNext(ctx, skip)
end
local nextBackoff = -1
local first = redis.call("ZRANGE", backoffKey, 0, 0, "WITHSCORES")
if #first == 2 then nextBackoff = tonumber(first[2]) end
for _, v in ipairs({choice.mac, choice.group, choice.starving and 1 or 0, tostring(nextBackoff),
                    tostring(choice.longest), tostring(choice.wait), choice.weight, tostring(choice.runner)}) do
  out[#out + 1] = v
end
return out
