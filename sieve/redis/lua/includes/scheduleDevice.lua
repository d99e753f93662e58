--[[
  scheduleDevice(device, now_ms) -> "ready" | "idle"
  Puts a device that is not being served into the schedule set of its best priority, scored by the time its
  wait started: max(oldest task's enqueue time, last time it was served); the same score in its caller group's
  ready set, and its caller group is ready (callerReady).
  device.write / device.drop, when the caller has them: meta fields (name, value, ...) and field names to delete
  that it left to be written with the meta's own (writeMeta), before them.
  device.known, when the caller has it: {class, lastServed}, the meta's class and last_served_ms as they are
  now (read or written in the same step), which spares reading them back.
  A device with no queued work becomes idle; with nothing outstanding either (no lease, no delayed task:
  countOutstanding) its meta is deleted instead (it would say nothing a missing one does not).
]]
--@requires deviceHeads, callerGroup
-- HSET of the device's meta with `fields` (name, value, ...) after what the caller left to write with it
-- (device.write; device.drop: fields to delete), so that a step writes the meta once
local function writeMeta(device, fields, drop)
  local args = device.write or {}
  for _, v in ipairs(fields) do args[#args + 1] = v end
  local gone = device.drop or {}
  for _, v in ipairs(drop or {}) do gone[#gone + 1] = v end
  device.write, device.drop = nil, nil
  if #args > 0 then redis.call("HSET", device.meta, unpack(args)) end
  if #gone > 0 then redis.call("HDEL", device.meta, unpack(gone)) end
end

local function scheduleDevice(device, now)
  local mac = device.mac
  local oldest, best = deviceHeads(device)
  -- (device.known: the caller just wrote or read these fields in the same step, and says what they hold)
  local known = device.known
  device.known = nil
  local m = known and {known.class or false, known.lastServed or false}
    or redis.call("HMGET", device.meta, "class", "last_served_ms")
  local previous = tonumber(m[1] or "0")
  if previous > 0 then redis.call("ZREM", device.schedules[previous], mac) end
  if best == 0 then
    -- (popDevice, which just took the device out of its sets and handed tasks out, says so: device.unscheduled,
    -- device.outstanding)
    if not device.unscheduled then redis.call("ZREM", device.groupReady, mac) end
    if device.outstanding or tonumber(redis.call("HGET", device.meta, "outstanding") or "0") > 0 then
      writeMeta(device, {"state", "idle", "class", 0, "backlog", 0}, {"oldest_ms"})
    else
      device.write, device.drop = nil, nil -- (nothing of it is kept)
      redis.call("DEL", device.meta)
    end
    return "idle"
  end
  local served = tonumber(m[2] or "0")
  local since = oldest
  if served > since then since = served end
  redis.call("ZADD", device.schedules[best], since, mac)
  redis.call("ZADD", device.groupReady, since, mac)
  writeMeta(device, {"state", "ready", "class", best, "oldest_ms", oldest, "since_ms", since,
    "group", device.group, "cweight", device.cweight})
  callerReady(device)
  return "ready"
end
