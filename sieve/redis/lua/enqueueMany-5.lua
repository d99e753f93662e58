--[[
  Enqueues the new tasks of many devices in one atomic step: each device in turn is admitted on its own and its
  tasks queued (enqueueDevice), in the order given, so a refused device changes nothing of its own and does not
  stop the others; one wake-up (the first device that became schedulable) for all of them. A SubmitBatch over 500 devices with a task each
  is one call, not 500: the device keys are named in the script (deviceKeys) from the hash tag.

  Input:
    KEYS[1]      pendingKey     global pending counter
    KEYS[2]      overloadedKey  overloaded devices set
    KEYS[3]      devicesKey     active devices set
    KEYS[4]      generationKey  generation (exists while Redis holds the queues rebuilt from PostgreSQL)
    KEYS[5]      callerKey      caller counts (caller -> tasks it has open: queued, leased or delayed)

    ARGV[1]      now            now (ms)
    ARGV[2]      maxPending     global pending limit
    ARGV[3]      maxPerDevice   per-device pending limit
    ARGV[4]      maxPerCaller   per-caller limit of open tasks, applied to each caller of the entries
    ARGV[5]      wakeChannel    wake channel (published to once when a device became schedulable)
    ARGV[6]      needsRebuilt   1 to refuse when the generation key is missing (Redis lost its memory and has
                                not been rebuilt yet), 0 for the rebuild itself
    ARGV[7]      base           the keys' hash tag ("{prefix}")
    ARGV[8..]    devices        per device: mac, weight, group (its caller group when new to Redis), cweight,
                                n, then its n entries (sieve/redis/entry.py)

  Output:
    {code_1, backlog_1, pending_1, open_1, code_2, ...}   per device: OK, GLOBAL_LIMIT, CALLER_LIMIT or
                                                          DEVICE_LIMIT (marked overloaded); its backlog, the
                                                          global pending count, the first caller's open tasks
                                                          (that caller's, when its limit refused)
    {REDIS_NOT_READY}                                     refused: Redis lost its memory and is not rebuilt yet
    (codes: includes/codes.lua)
]]
--@requires codes, slice, deviceBlock, enqueueDevice

local now = tonumber(ARGV[1])
local maxPending = tonumber(ARGV[2])
local maxPerDevice = tonumber(ARGV[3])
local maxPerCaller = tonumber(ARGV[4])
local wakeChannel = ARGV[5]
local needsRebuilt = ARGV[6] == "1"
local base = ARGV[7]
local devices = slice(ARGV, 8)
local pendingKey = KEYS[1]
local overloadedKey = KEYS[2]
local devicesKey = KEYS[3]
local generationKey = KEYS[4]
local callerKey = KEYS[5]

if needsRebuilt and redis.call("EXISTS", generationKey) == 0 then
  return {CODE.REDIS_NOT_READY}
end
local g = {pending = pendingKey, overloaded = overloadedKey, devices = devicesKey, caller = callerKey}
local out, woke, i = {}, nil, 1
while i <= #devices do
  local mac, weight, group, cweight, n = devices[i], devices[i + 1], devices[i + 2], devices[i + 3],
    tonumber(devices[i + 4])
  local raws = {}
  for j = 1, n do raws[j] = devices[i + 4 + j] end
  i = i + 5 + n
  local device = deviceBlock(deviceKeys(base, mac, weight), mac, group, cweight, ENQUEUE_FIELDS)
  local a = {now = now, maxPending = maxPending, maxPerDevice = maxPerDevice, maxPerCaller = maxPerCaller,
             weight = weight}
  local result, became = enqueueDevice(device, g, a, raws)
  for _, v in ipairs(result) do out[#out + 1] = v end
  if became and not woke then woke = mac end
end
flushCounts(g)
if woke then redis.call("PUBLISH", wakeChannel, woke) end
return out
