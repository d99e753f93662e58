--[[
  countCaller(counts_key, entry, delta)
  Adds delta to the count of open tasks (queued, leased or delayed) of the entry's caller in the caller counts
  hash (caller -> count); a count that reaches 0 is removed. An entry without a caller (queued before callers
  were recorded) is not counted.
]]
local function countCaller(countsKey, e, delta)
  if e.caller == "" then return end
  if redis.call("HINCRBY", countsKey, e.caller, delta) <= 0 then redis.call("HDEL", countsKey, e.caller) end
end
