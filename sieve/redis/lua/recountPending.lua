--[[
  Sets the global pending counter to the number of entries in the queues of every active device, in one atomic
  step: after Redis lost queue lists behind Sieve's back the counter still counted their tasks (the reconciler
  runs this at the end of a pass that found anything wrong: scheduler_svc/reconcile.py). O(active devices).

  Input:
    KEYS[1]      pendingKey    global pending counter
    KEYS[2]      devicesKey    active devices set
    KEYS[3..]    queueKeys     the queues (priority 1..5) of each device of ARGV, five per device, in ARGV's order
    ARGV[1..]    devicesRead   the active devices as the caller read them

  Output:
    {OK, before, after}   the counter before and after
    {DEVICES_CHANGED}     a device became active since the caller read them (nothing changed: read again)
    (codes: includes/codes.lua)
]]
--@requires codes, slice

local pendingKey = KEYS[1]
local devicesKey = KEYS[2]
local queueKeys = slice(KEYS, 3)
local devicesRead = slice(ARGV, 1)

local given = {}
for _, mac in ipairs(devicesRead) do given[mac] = true end
for _, mac in ipairs(redis.call("SMEMBERS", devicesKey)) do
  if not given[mac] then return {CODE.DEVICES_CHANGED} end
end
local total = 0
for _, key in ipairs(queueKeys) do total = total + redis.call("LLEN", key) end
local before = tonumber(redis.call("GET", pendingKey) or "0")
redis.call("SET", pendingKey, total)
return {CODE.OK, before, total}
