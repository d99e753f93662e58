--[[
  What one shard has ready, for splitting a claim round's budget across shards (read-only; only with several
  shards: sieve/redis/queue_store.py, QueueStore.claim). For every caller group with a ready device (the callers
  sets, one per caller weight), the weighted count of its ready devices (the sum over its schedule sets of the
  set's device weight times its size) and their number. Also the first backoff deadline, as claimDevices reports
  it.

  Input:
    KEYS[1]      backoffKey         backoff set of the shard
    ARGV[1]      classesText        every schedule set's "priority:weight", comma separated
    ARGV[2]      callerWeightsText  every caller weight in use, comma separated
    ARGV[3]      base               the shard's hash tag ("{prefix}" or "{prefix~s}")

  Output:
    {next backoff (ms, -1 when none), group_1, caller weight_1, weighted devices_1, devices_1, group_2, ...}
]]

local backoffKey = KEYS[1]
local classesText = ARGV[1]
local callerWeightsText = ARGV[2]
local base = ARGV[3]

local classes = {}
for prio, weight in string.gmatch(classesText, "(%d+):(%d+)") do
  classes[#classes + 1] = {prio, tonumber(weight)}
end
local nextBackoff = -1
local first = redis.call("ZRANGE", backoffKey, 0, 0, "WITHSCORES")
if #first == 2 then nextBackoff = tonumber(first[2]) end
local out = {tostring(nextBackoff)}
for cweight in string.gmatch(callerWeightsText, "(%d+)") do
  for _, group in ipairs(redis.call("ZRANGE", base .. ":callers:" .. cweight, 0, -1)) do
    local demand, count = 0, 0
    for _, class in ipairs(classes) do
      local size = redis.call("ZCARD", base .. ":sched:" .. class[1] .. ":" .. class[2] .. ":" .. group)
      demand = demand + size * class[2]
      count = count + size
    end
    if demand > 0 then
      out[#out + 1] = group
      out[#out + 1] = cweight
      out[#out + 1] = demand
      out[#out + 1] = count
    end
  end
end
return out
