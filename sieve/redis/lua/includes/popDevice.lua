--[[
  popDevice(device, lockKey, g, a) -> code, taken, expired, blockedType, tasted
  Claims a device for serving and takes up to a.want of its tasks (popBatch, claimDevices).

  Takes the device's dispatch lock (SET NX PX with a.token), moves the device from its schedule set to the
  serving set (its caller group was served: callerServed) — with a.release, whose dispatch ends in this same
  step, it only checks that no other dispatch holds the lock —, then pops: the highest priority first, except that a
  head task that has waited max_wait or longer is taken before any younger one (low priority never starves).
  Expired tasks are dropped on the way (the caller records them EXPIRED). Each popped task's attempt is raised
  and it is leased until now + lease_ttl; the new attempt number is its fencing token.

  Popping stops before a task whose type has no budget left (a.budget: type -> tasks that may still be taken,
  nil for any type): blockedType is then that type (0 when popping did not stop so). With a.release the
  dispatch ends in the same step (lock dropped, device rescheduled with its wait restarting at
  now - a.carriedWait).

  g: the global keys: pending, serving, leases, leaseData, overloaded, devices, caller (caller open counts).
  a: now, token, lockTtl, want, maxWait, leaseTtl, maxPerDevice, budget, release, carriedWait, for the
  caller's charge (callerServed) msPerTask (what one task is worth, ms), and firstWant (optional: most tasks
  a device takes at its first serve since it became active).
  code: OK, LOCK_HELD (another dispatch holds the lock) or DEVICE_NOT_READY (not schedulable: taken by another
  replica, idle, backing off); taken: leased entries (attempt raised); expired: entries dropped as expired;
  tasted: true when a.firstWant cut this first serve short.
]]
--@requires codes, parseEntry, countCaller, reschedule, callerGroup, chargeDevice

-- the meta fields a serve reads (claimDevices reads them with the device's group: deviceBlock's `fields`)
local POP_FIELDS = {"state", "class", "last_served_ms", "win_start_ms", "win_count", "wall_ms", "backlog",
  "lead_ms", "debt_ms", "served", "outstanding", "uncharged"}

local function popDevice(device, lockKey, g, a)
  local mac, now = device.mac, a.now
  -- released in the same step, the dispatch needs no lock of its own (nobody sees it held) but must respect
  -- one another dispatch holds
  if a.release then
    if redis.call("EXISTS", lockKey) == 1 then return CODE.LOCK_HELD, {}, {}, 0 end
  elseif not redis.call("SET", lockKey, a.token, "NX", "PX", a.lockTtl) then
    return CODE.LOCK_HELD, {}, {}, 0
  end
  local m = device.readOf == POP_FIELDS and device.read or redis.call("HMGET", device.meta, unpack(POP_FIELDS))
  device.read, device.readOf = nil, nil
  if m[1] ~= "ready" then
    if not a.release then redis.call("DEL", lockKey) end
    if redis.call("EXISTS", device.meta) == 0 then
      -- no meta at all (its keys were lost): out of the schedule sets, or the next rank picks it again and the
      -- dispatcher spins on it; the reconciler repairs the device and schedules it again
      unscheduleDevice(device)
    end
    return CODE.DEVICE_NOT_READY, {}, {}, 0
  end
  local class = tonumber(m[2] or "0")
  local previous = tonumber(m[3] or "0")
  unscheduleDevice(device, class)
  device.unscheduled = true -- out of its schedule set and its group's ready set (scheduleDevice need not)
  -- the meta's new fields, written in one HSET (and one HDEL) once the serve is decided: every field below is
  -- read from `m` above, so the result is what writing each as it changes would leave
  local fields, gone = {class = 0, last_served_ms = now - a.carriedWait}, {}
  if not a.release then
    redis.call("ZADD", g.serving, now + tonumber(a.lockTtl), mac)
    fields.state, fields.token = "serving", a.token
  end

  -- the device's non-empty queues, highest priority first
  -- (the queue of its class, its best priority, holds all of its backlog most of the time: then the others are
  -- empty and need no LLEN)
  local sizes = {0, 0, 0, 0, 0}
  local backlog = tonumber(m[7] or "0")
  if class >= 1 and class <= 5 and backlog > 0 then sizes[class] = redis.call("LLEN", device.queues[class]) end
  if sizes[class] == nil or backlog <= 0 or sizes[class] ~= backlog then
    for p = 5, 1, -1 do sizes[p] = redis.call("LLEN", device.queues[p]) end
  end

  local function nextQueue()
    local agedAt, agedPrio, best, nonEmpty = false, 0, 0, 0
    for p = 5, 1, -1 do
      if sizes[p] > 0 then
        nonEmpty = nonEmpty + 1
        if best == 0 then best = p end
      end
    end
    if nonEmpty <= 1 then return best end
    for p = 5, 1, -1 do
      if sizes[p] > 0 then
        local e = parseEntry(redis.call("LINDEX", device.queues[p], 0))
        if now - e.enq >= a.maxWait and ((not agedAt) or e.enq < agedAt) then agedAt, agedPrio = e.enq, p end
      end
    end
    if agedPrio > 0 then return agedPrio end
    return best
  end

  -- fair by cost: about a quantum of the device's known cost per serve (costQuantum); and a device served for
  -- the first time since it became active (no last serve in its meta) takes at most a.firstWant: a newcomer
  -- behind busy devices gets a task at once, the rest of its batch at its next serve
  local want, tasted = costQuantum(tonumber(m[6] or ""), a.want), false
  if a.firstWant and previous == 0 and a.firstWant < want then want, tasted = a.firstWant, true end
  local budget = a.budget
  local taken, expired = {}, {}
  local leaseArgs, dataArgs = {}, {}
  local blocked = 0
  local leaseUntil = now + a.leaseTtl
  while #taken < want do
    local p = nextQueue()
    if p == 0 then break end
    -- (popped at once: a head whose type has no budget left goes back, which is rare)
    local raw = redis.call("LPOP", device.queues[p])
    local e = parseEntry(raw)
    if e.exp > now and budget and (budget[e.type] or 0) <= 0 then
      redis.call("LPUSH", device.queues[p], raw)
      blocked = tonumber(e.type)
      break
    end
    sizes[p] = sizes[p] - 1
    if e.exp <= now then
      expired[#expired + 1] = raw
      countCaller(g.caller, e, -1)
    else
      if budget then budget[e.type] = budget[e.type] - 1 end
      e.attempt = e.attempt + 1
      local leased = encodeEntry(e)
      leaseArgs[#leaseArgs + 1] = leaseUntil
      leaseArgs[#leaseArgs + 1] = e.id
      dataArgs[#dataArgs + 1] = e.id
      dataArgs[#dataArgs + 1] = mac .. "|" .. leased
      taken[#taken + 1] = leased
    end
  end
  if #taken > 0 then
    redis.call("ZADD", g.leases, unpack(leaseArgs))
    redis.call("HSET", g.leaseData, unpack(dataArgs))
    -- (countOutstanding, with the count read above)
    fields.outstanding = tonumber(m[11] or "0") + #taken
    device.outstanding = fields.outstanding > 0
    -- fair by cost: by what its tasks cost
    chargeServe(fields, gone, #taken, now - a.carriedWait, previous, m[6], m[8] ~= false and m[8] ~= nil, m[9],
      m[12])
  end

  local removed = #taken + #expired
  if removed > 0 then
    fields.backlog = tonumber(m[7] or "0") - removed
    redis.call("DECRBY", g.pending, removed)
    if fields.backlog < a.maxPerDevice then redis.call("SREM", g.overloaded, mac) end
    fields.served = tonumber(m[10] or "0") + #taken
  end
  -- service rate, for the retry delay intake gives a refused device: tasks taken per 10 s window
  local winStart = tonumber(m[4] or "0")
  if now - winStart >= 10000 then
    if winStart > 0 then
      local count = tonumber(m[5] or "0")
      fields.rate_per_s = string.format("%.3f", count * 1000 / (now - winStart))
    end
    fields.win_start_ms, fields.win_count = now, #taken
  elseif #taken > 0 then
    fields.win_count = tonumber(m[5] or "0") + #taken
  end
  if a.release and #taken > 0 then fields.defer_count = 0 end

  local args = {}
  for field, value in pairs(fields) do
    args[#args + 1] = field
    args[#args + 1] = value
  end
  if a.release then
    device.sizes = sizes -- what is left in its queues: deviceHeads reads only those that hold something
    -- what scheduleDevice would read back from the meta, as if written; it writes these fields with its own
    device.known = {class = fields.class, lastServed = fields.last_served_ms}
    device.write, device.drop = args, gone
    reschedule(device, now, g.devices)
  else
    redis.call("HSET", device.meta, unpack(args))
    if #gone > 0 then redis.call("HDEL", device.meta, unpack(gone)) end
  end
  callerServed(device, #taken * a.msPerTask / tonumber(device.cweight))
  return CODE.OK, taken, expired, blocked, tasted and #taken > 0
end

--[[
  parseBudget(text) -> budget for popDevice
  "" allows any type (nil); "-" allows none; "type:count,..." allows count tasks of each type named, a type
  without a count ("type") any number of them.
]]
local function parseBudget(text)
  if text == "" then return nil end
  local budget = {}
  for item in string.gmatch(text, "[^,]+") do
    local t, n = string.match(item, "^(%d+):(%d+)$")
    if t then budget[t] = tonumber(n) elseif string.match(item, "^%d+$") then budget[item] = math.huge end
  end
  return budget
end
