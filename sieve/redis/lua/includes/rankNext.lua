--[[
  rankNext(ctx, skip) -> choice
  Picks the device to serve next, in two levels; read-only but for dropping a caller with no ready device left.

  1. The caller group: among ready callers (ctx.callerWeights: one callers set per caller weight), the lowest
     score (start-time fair queueing: callerGroup), then the heavier caller. A caller with a thousand devices
     and a caller with one are served alike: a group is charged for every task any of its devices takes,
     over its weight.
  2. The device within that caller: a device's wait = now - since, where since = max(oldest task's enqueue
     time, last served time) (the schedule sets' scores). Devices whose wait reached max_wait form the top tier
     whatever their priority; otherwise higher priority first. Within a tier: min(wait, max_wait) x weight, then
     the longest wait (a device served at a later point of a claim round's clock than `now` has a wait below
     zero, which counts weight times less). Each schedule set is ordered by since, so only the first members of each set are read:
     O(k log n) for k sets and n devices.
  A caller whose every ready device is `skip` gives way to the next one, and so does one whose cap for this call
  is spent (ctx.groupLeft: group -> tasks it may still give; claimDevices with several shards), the callers sets
  then read ctx.groupHeads deep.

  ctx: now, maxWait, hint (ms), classes ({prio, weight} of each schedule set), callerWeights, base (hash tag);
  optional empty: a table of schedule sets found empty, not read again (claimDevices keeps it for one call and
  clears it whenever a device it served is scheduled again: one-task devices leave their sets, nothing enters).
  choice: mac ("" when no device is schedulable), group, cweight, weight (the device's), wait (its wait, ms),
  runner (the best score of another device of its tier and caller, or -1), starving (another device of its
  caller waited the hint or longer), longest (the longest wait seen among the caller's devices, or -1).
]]
--@requires callerGroup
local function rankDevicesOf(ctx, group, skip)
  local now, maxWait = ctx.now, ctx.maxWait
  local best, bestTier, bestScore, bestSince, bestWait, bestWeight = "", -1, -1, 0, 0, 0
  local waits, candidates = {}, {}
  local empty = ctx.empty
  -- the group's schedule sets' names, built once per script call (rankNext runs once per device claimed)
  local names = ctx.setNames[group]
  if not names then
    names = {}
    for i, class in ipairs(ctx.classes) do names[i] = ctx.base .. ":sched:" .. class[1] .. ":" .. class[2] .. ":" .. group end
    ctx.setNames[group] = names
  end
  for i, class in ipairs(ctx.classes) do
    local prio, weight = class[1], class[2]
    local key = names[i]
    local heads = {}
    if not (empty and empty[key]) then
      heads = redis.call("ZRANGE", key, 0, 2, "WITHSCORES")
      if empty and #heads == 0 then empty[key] = true end
    end
    local considered = 0
    for j = 1, #heads, 2 do
      local mac = heads[j]
      if mac ~= skip and considered < 2 then
        local since = tonumber(heads[j + 1])
        -- negative for a device served at a later point of a claim round's clock than `now`: it waits longer
        local wait = now - since
        waits[#waits + 1] = {mac, wait}
        if considered == 0 then
          local tier, capped = prio, wait
          if wait >= maxWait then tier, capped = 6, maxWait end
          -- a wait below zero counts weight times less: the heavier of two devices ahead of `now` comes back first
          local score = capped * weight
          if capped < 0 then score = capped / weight end
          candidates[#candidates + 1] = {mac, tier, score}
          -- ties go to the heavier device, then to the longer wait
          if tier > bestTier or (tier == bestTier and (score > bestScore or
              (score == bestScore and (weight > bestWeight or (weight == bestWeight and since < bestSince))))) then
            best, bestTier, bestScore, bestSince, bestWait, bestWeight = mac, tier, score, since, wait, weight
          end
        end
        considered = considered + 1
      end
    end
  end
  local runner = -1
  for _, c in ipairs(candidates) do
    if c[1] ~= best and c[2] == bestTier and c[3] > runner then runner = c[3] end
  end
  return best, bestWait, bestWeight, runner, waits
end

local function rankNext(ctx, skip)
  local groups = {}
  for i, cw in ipairs(ctx.callerWeights) do
    local key = ctx.callerSets[i]
    local heads = redis.call("ZRANGE", key, 0, ctx.groupHeads or 2, "WITHSCORES")
    for j = 1, #heads, 2 do
      local score = tonumber(heads[j + 1])
      groups[#groups + 1] = {name = heads[j], cweight = cw, key = key, score = score}
    end
  end
  table.sort(groups, function(a, b)
    if a.score ~= b.score then return a.score < b.score end
    if a.cweight ~= b.cweight then return a.cweight > b.cweight end
    return a.name < b.name
  end)
  local choice = {mac = "", group = "", cweight = 0, weight = 0, wait = 0, runner = -1, starving = false,
                  longest = -1}
  for _, g in ipairs(groups) do
    local left = ctx.groupLeft and ctx.groupLeft[g.name]
    if left == nil or left > 0 then
      local mac, wait, weight, runner, waits = rankDevicesOf(ctx, g.name, skip)
      if mac ~= "" then
        choice.mac, choice.group, choice.cweight, choice.weight, choice.wait, choice.runner =
          mac, g.name, g.cweight, weight, wait, runner
        for _, w in ipairs(waits) do
          if w[2] > choice.longest then choice.longest = w[2] end
          if w[1] ~= mac and w[2] >= ctx.hint then choice.starving = true end
        end
        return choice
      end
      if redis.call("ZCARD", ctx.base .. ":gready:" .. g.name) == 0 then
        redis.call("ZREM", g.key, g.name) -- its devices left without the group noticing (backoff, repair)
        callerLeft(g.key, g.name)
      end
    end
  end
  return choice
end

--[[
  rankContext(base, now, maxWait, hint, classesText, callerWeightsText) -> ctx for rankNext
  classesText: "prio:weight,prio:weight,..." (every schedule set); callerWeightsText: "1,2,..." (every caller
  weight in use).
]]
local function rankContext(base, now, maxWait, hint, classesText, callerWeightsText)
  local classes, callerWeights = {}, {}
  for prio, weight in string.gmatch(classesText, "(%d+):(%d+)") do
    classes[#classes + 1] = {tonumber(prio), tonumber(weight)}
  end
  local callerSets = {}
  for cw in string.gmatch(callerWeightsText, "%d+") do
    callerWeights[#callerWeights + 1] = tonumber(cw)
    callerSets[#callerSets + 1] = base .. ":callers:" .. tonumber(cw)
  end
  return {base = base, now = now, maxWait = maxWait, hint = hint, classes = classes, callerWeights = callerWeights,
          callerSets = callerSets, setNames = {}}
end
