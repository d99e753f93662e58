--[[
  Picks the device to serve next (rankNext: the caller first, then its device); changes nothing but the
  callers set of a caller found with no ready device.

  Input:
    KEYS[1]      backoffKey     backoff set (the first device to come out of backoff is reported)

    ARGV[1]      now            now (ms)
    ARGV[2]      maxWait        max_wait (ms)
    ARGV[3]      hint           starvation hint (ms)
    ARGV[4]      skip           device to skip ("" for none)
    ARGV[5]      classesText    every schedule set's "priority:weight", comma separated
    ARGV[6]      callerWeightsText every caller weight in use, comma separated
    ARGV[7]      base           the keys' hash tag ("{prefix}"): the sets rankNext reads are named from it

  Output:
    {mac, group, starving 0|1, earliest backoff end (ms) or -1, longest wait (ms) or -1,
     the chosen device's wait (ms), its weight, the best score of another device in its tier or -1}
    mac is "" when no device is schedulable. Numbers are returned as strings (fractions of a ms kept).
]]
--@requires rankNext

local now = tonumber(ARGV[1])
local maxWait = tonumber(ARGV[2])
local hint = tonumber(ARGV[3])
local skip = ARGV[4]
local classesText = ARGV[5]
local callerWeightsText = ARGV[6]
local base = ARGV[7]
local backoffKey = KEYS[1]

local choice = rankNext(rankContext(base, now, maxWait, hint, classesText, callerWeightsText), skip)

local nextBackoff = -1
local first = redis.call("ZRANGE", backoffKey, 0, 0, "WITHSCORES")
if #first == 2 then nextBackoff = tonumber(first[2]) end

return {choice.mac, choice.group, choice.starving and 1 or 0, tostring(nextBackoff), tostring(choice.longest),
        tostring(choice.wait), choice.weight, tostring(choice.runner)}
