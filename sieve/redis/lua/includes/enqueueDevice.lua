--[[
  enqueueDevice(device, g, a, raws) -> {code, backlog, pending, open}, woke
  Enqueues one device's new tasks with admission control (enqueueMany): refused as a whole when the
  global pending limit, a caller's limit of open tasks or the device's pending limit would be exceeded (a device
  over its limit is marked overloaded); else each entry goes to the back of its priority's queue, the counters
  move, and a device that was not being served or backing off is scheduled (woke: it became schedulable; the
  caller publishes a wake-up).

  g: the global keys: pending, overloaded, devices, caller (caller open counts); g.counts is kept here (the
  counts as the call left them: the caller of several enqueueDevice in one step passes the same g).
  a: now, maxPending, maxPerDevice, maxPerCaller, weight (the device's).
  raws: the entries (sieve/redis/entry.py). Codes: OK, GLOBAL_LIMIT, CALLER_LIMIT, DEVICE_LIMIT (codes.lua);
  open: the first caller's open tasks now (that caller's, when its limit refused them; 0 without one).
]]
--@requires codes, parseEntry, scheduleDevice

-- the meta fields an enqueue reads (enqueueMany reads them with the device's group: deviceBlock's `fields`)
local ENQUEUE_FIELDS = {"backlog", "state", "class", "last_served_ms"}

--[[
  flushCounts(g) -> nothing
  Writes the global pending count and the callers' open counts that enqueueDevice moved in this call (g.counts):
  one INCRBY and one HINCRBY per caller for the whole call. The script that enqueues calls it last.
]]
local function flushCounts(g)
  local counts = g.counts
  if not counts then return end
  if counts.added > 0 then redis.call("INCRBY", g.pending, counts.added) end
  for caller, n in pairs(counts.addedFor) do redis.call("HINCRBY", g.caller, caller, n) end
  counts.added, counts.addedFor = 0, {}
end

local function enqueueDevice(device, g, a, raws)
  local mac, now = device.mac, a.now
  local n = #raws
  -- the global and caller counts as this script call last left them (g.counts: read once per call, kept up to
  -- date by every device it enqueues), the device's meta fields in one read
  -- (written once, at the end of the call: flushCounts; added, addedFor: what is not written yet)
  local counts = g.counts
  if not counts then
    counts = {pending = tonumber(redis.call("GET", g.pending) or "0"), opened = {}, added = 0, addedFor = {}}
    g.counts = counts
  end
  local pending = counts.pending
  local facts = device.readOf == ENQUEUE_FIELDS and device.read
    or redis.call("HMGET", device.meta, unpack(ENQUEUE_FIELDS))
  device.read, device.readOf = nil, nil
  local backlog = tonumber(facts[1] or "0")

  -- the entries' callers, in order of first appearance, with their counts
  local entries, callers, incoming = {}, {}, {}
  for _, raw in ipairs(raws) do
    local e = parseEntry(raw)
    entries[#entries + 1] = e
    if e.caller ~= "" then
      if not incoming[e.caller] then
        callers[#callers + 1] = e.caller
        incoming[e.caller] = 0
      end
      incoming[e.caller] = incoming[e.caller] + 1
    end
  end
  local opened = {}
  for i, caller in ipairs(callers) do
    local known = counts.opened[caller]
    if known == nil then
      known = tonumber(redis.call("HGET", g.caller, caller) or "0")
      counts.opened[caller] = known
    end
    opened[i] = known
  end
  local first = opened[1] or 0

  if pending + n > a.maxPending then
    return {CODE.GLOBAL_LIMIT, backlog, pending, first}, false
  end
  for i, caller in ipairs(callers) do
    if opened[i] + incoming[caller] > a.maxPerCaller then
      return {CODE.CALLER_LIMIT, backlog, pending, opened[i]}, false
    end
  end
  if backlog + n > a.maxPerDevice then
    redis.call("SADD", g.overloaded, mac)
    return {CODE.DEVICE_LIMIT, backlog, pending, first}, false
  end

  -- a device that had nothing queued holds just these now: scheduleDevice reads only the queues they went to,
  -- and their heads are the first entries pushed to each (deviceHeads need not read them back)
  local sizes = backlog == 0 and {0, 0, 0, 0, 0} or nil
  local heads = backlog == 0 and {} or nil
  for i, raw in ipairs(raws) do
    local prio = entries[i].prio
    redis.call("RPUSH", device.queues[prio], raw)
    if sizes then
      if sizes[prio] == 0 then heads[prio] = raw end
      sizes[prio] = sizes[prio] + 1
    end
  end
  device.sizes, device.heads = sizes, heads
  for i, caller in ipairs(callers) do
    opened[i] = opened[i] + incoming[caller]
    counts.opened[caller] = opened[i]
    counts.addedFor[caller] = (counts.addedFor[caller] or 0) + incoming[caller]
  end
  backlog = backlog + n
  pending = pending + n
  counts.pending, counts.added = pending, counts.added + n
  local fields = {"backlog", backlog, "weight", a.weight, "device", mac}
  redis.call("SADD", g.devices, mac)

  local state = facts[2]
  local woke = false
  if state == false or state == "idle" or state == "ready" then
    -- (nothing above changed the meta's class or last serve); the fields above are written with its own
    device.known = {class = facts[3], lastServed = facts[4]}
    device.write = fields
    -- a ready device may have gained a higher priority: scheduleDevice moves it to the right set
    local became = scheduleDevice(device, now)
    woke = state ~= "ready" and became == "ready"
  else
    redis.call("HSET", device.meta, unpack(fields))
  end
  -- "serving" and "backoff" devices are rescheduled by releaseDevice / resumeDevice
  return {CODE.OK, backlog, pending, opened[1] or 0}, woke
end
