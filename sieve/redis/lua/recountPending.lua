--[[
  Sets the global pending counter to the number of entries in the queues of every active device, in one atomic
  step: after Redis lost queue lists behind Sieve's back the counter still counted their tasks (the reconciler
  runs this at the end of a pass that found anything wrong: scheduler_svc/reconcile.py). O(active devices).

  Input:
    KEYS[1]      global pending counter
    KEYS[2]      active devices set
    KEYS[3..]    the queues (priority 1..5) of each device of ARGV, five per device, in ARGV's order
    ARGV[1..]    the active devices as the caller read them

  Output:
    {before, after}   the counter before and after
    {-1}              a device became active since the caller read them (nothing changed: read again)
]]
local given = {}
for i = 1, #ARGV do given[ARGV[i]] = true end
for _, mac in ipairs(redis.call("SMEMBERS", KEYS[2])) do
  if not given[mac] then return {-1} end
end
local total = 0
for i = 3, #KEYS do total = total + redis.call("LLEN", KEYS[i]) end
local before = tonumber(redis.call("GET", KEYS[1]) or "0")
redis.call("SET", KEYS[1], total)
return {before, total}
