--[[
  Picks the device to serve next; read-only.

  Rule: a device's wait = now - since, where since = max(oldest task's enqueue time, last served time)
  (the schedule sets' scores). Devices whose wait reached max_wait form the top tier whatever their
  priority; otherwise higher priority first. Within a tier: min(wait, max_wait) x weight, then the
  longest wait. Each schedule set is ordered by since, so only the first members of each set are read:
  O(k log n) for k sets and n devices.

  Input:
    KEYS[1..k]   scheduleKeys  schedule sets (one per priority and weight)
    KEYS[k+1]    backoffKey    backoff set

    ARGV[1]      now           now (ms)
    ARGV[2]      maxWait       max_wait (ms)
    ARGV[3]      hint          starvation hint (ms)
    ARGV[4]      skip          device to skip ("" for none)
    ARGV[5..]    classes       for each schedule set, in KEYS order: "priority:weight"

  Output:
    {mac, set index (1-based), starving 0|1, earliest backoff end (ms) or -1, longest wait (ms) or -1,
     the chosen device's wait (ms), its weight, the best score of another device in its tier or -1}
    mac is "" when no device is schedulable. Numbers are returned as strings (fractions of a ms kept).
]]
--@requires slice

local now = tonumber(ARGV[1])
local maxWait = tonumber(ARGV[2])
local hint = tonumber(ARGV[3])
local skip = ARGV[4]
local classes = slice(ARGV, 5)
local scheduleKeys = slice(KEYS, 1, #KEYS - 1)
local backoffKey = KEYS[#KEYS]

local k = #scheduleKeys

local best, bestTier, bestScore, bestSince, bestIndex, bestWait, bestWeight = "", -1, -1, 0, 0, 0, 0
local waits = {}
local candidates = {}
for i = 1, k do
  local prio, weight = string.match(classes[i], "(%d+):(%d+)")
  prio = tonumber(prio)
  weight = tonumber(weight)
  local heads = redis.call("ZRANGE", scheduleKeys[i], 0, 2, "WITHSCORES")
  local considered = 0
  for j = 1, #heads, 2 do
    local mac = heads[j]
    if mac ~= skip and considered < 2 then
      local since = tonumber(heads[j + 1])
      local wait = now - since
      if wait < 0 then wait = 0 end
      waits[#waits + 1] = {mac, wait}
      if considered == 0 then
        local tier = prio
        local capped = wait
        if wait >= maxWait then
          tier = 6
          capped = maxWait
        end
        local score = capped * weight
        candidates[#candidates + 1] = {mac, tier, score}
        -- ties go to the heavier device, then to the longer wait
        if tier > bestTier or (tier == bestTier and (score > bestScore or
            (score == bestScore and (weight > bestWeight or (weight == bestWeight and since < bestSince))))) then
          best, bestTier, bestScore, bestSince, bestIndex, bestWait, bestWeight =
            mac, tier, score, since, i, wait, weight
        end
      end
      considered = considered + 1
    end
  end
end

local starving = 0
local longest = -1
for _, w in ipairs(waits) do
  if w[2] > longest then longest = w[2] end
  if w[1] ~= best and w[2] >= hint then starving = 1 end
end

local nextBackoff = -1
local first = redis.call("ZRANGE", backoffKey, 0, 0, "WITHSCORES")
if #first == 2 then nextBackoff = tonumber(first[2]) end

local runner = -1
for _, c in ipairs(candidates) do
  if c[1] ~= best and c[2] == bestTier and c[3] > runner then runner = c[3] end
end

return {best, bestIndex, starving, tostring(nextBackoff), tostring(longest), tostring(bestWait), bestWeight,
        tostring(runner)}
