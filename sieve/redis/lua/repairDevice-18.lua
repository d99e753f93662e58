--[[
  Mends one device's own keys when they disagree (deviceFacts), in one atomic step: the reconciler's repair of
  what Redis lost behind Sieve's back (scheduler_svc/reconcile.py). The queues are what is true: the backlog
  becomes their count, the device joins the active set when it has work, it leaves every schedule set it sits
  in, and unless it is being served (lock held, or in the serving set) or backing off (in the backoff set), it
  is scheduled afresh from its queues (or becomes idle). The global pending counter is left alone (the
  reconciler recounts it once per pass: recountPending).

  Input:
    KEYS[1..11]  device        device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey       device dispatch lock
    KEYS[13]     servingKey    serving set
    KEYS[14]     backoffKey    backoff set
    KEYS[15]     leasesKey     leases (unused; the same keys as locateTasks)
    KEYS[16]     leaseDataKey  lease data (unused)
    KEYS[17]     delayedKey    delayed set (unused)
    KEYS[18]     devicesKey    active devices set

    ARGV[1]      now           now (ms)
    ARGV[2]      mac           device (normalised MAC)
    ARGV[3]      weight        the device's weight
    ARGV[4]      group         the caller group whose schedule set the device was found in ("" when not known):
                               its group when its meta names none (a lost meta)

  Output:
    {problem, queued, backlog before}   problem "" when nothing was wrong (nothing changed)
]]
--@requires deviceBlock, deviceFacts, reschedule, callerGroup

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local weight = ARGV[3]
local group = ARGV[4]
local device = deviceBlock(KEYS, mac, group ~= "" and group or nil)
local lockKey = KEYS[12]
local servingKey = KEYS[13]
local backoffKey = KEYS[14]
local leasesKey = KEYS[15] -- unused
local leaseDataKey = KEYS[16] -- unused
local delayedKey = KEYS[17] -- unused
local devicesKey = KEYS[18]

local queued, backlog, state, problem = deviceFacts(device, lockKey, servingKey, backoffKey, devicesKey)
if group ~= "" and group ~= device.group then
  -- found in the sets of a group that is not its own: out of them
  local removed = redis.call("ZREM", string.match(device.meta, "^(%b{})") .. ":gready:" .. group, mac)
  for p = 1, 5 do
    local setBase = string.sub(device.schedules[p], 1, -(#device.group + 2)) -- without ":<its group>"
    removed = removed + redis.call("ZREM", setBase .. ":" .. group, mac)
  end
  if removed > 0 and problem == "" then problem = "stale schedule" end
end
if problem == "" then
  return {"", queued, backlog}
end
local serving = state == "serving" and (redis.call("EXISTS", lockKey) == 1 or redis.call("ZSCORE", servingKey, mac))
local backingOff = state == "backoff" and redis.call("ZSCORE", backoffKey, mac)
unscheduleDevice(device)
redis.call("HSET", device.meta, "backlog", queued, "class", 0, "device", mac)
redis.call("HSETNX", device.meta, "weight", weight)
if queued > 0 then redis.call("SADD", devicesKey, mac) end
if not (serving or backingOff) then
  redis.call("HDEL", device.meta, "token", "unschedulable_until_ms", "defer_reason")
  redis.call("HSET", device.meta, "state", "idle")
  reschedule(device, now, devicesKey)
end
return {problem, queued, backlog}
