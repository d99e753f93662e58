--[[
  deviceBlock(keys, mac[, group, cweight]) -> device
  The device block that every device script takes as its KEYS[1..11] (sieve/redis/keys.py, DeviceKeys.block),
  as a table: device.mac; device.meta, its meta hash; device.queues[p], its queue of priority p (1..5);
  device.schedules[p], the schedule set of priority p for the device's weight, within its caller group.

  The caller group is the caller that first queued work for the device (meta "group"; `group` names it for a
  device whose meta has none yet, "-" when nobody is named) and cweight that caller's weight (meta "cweight").
  KEYS[7..11] are the schedule sets' names without the group ("{p}:sched:<prio>:<weight>"); the group's sets are
  those names with ":<group>" appended (same hash tag, so the same Redis Cluster slot). device.groupReady is the
  group's ready devices by wait start, device.callers the ready callers of the group's weight, device.callerServed
  each caller's virtual start, device.vtime the virtual time and device.groups every group that had a ready
  device (callerGroup; Keys.group_ready / callers / caller_served / caller_vtime / groups).
]]
local function deviceBlock(keys, mac, group, cweight)
  local meta = keys[1]
  local known = redis.call("HMGET", meta, "group", "cweight")
  group = known[1] or group or "-"
  if group == "" then group = "-" end
  cweight = known[2] or cweight or "1"
  local base = string.match(meta, "^(%b{})")
  return {
    mac = mac,
    meta = meta,
    queues = {keys[2], keys[3], keys[4], keys[5], keys[6]},
    schedules = {keys[7] .. ":" .. group, keys[8] .. ":" .. group, keys[9] .. ":" .. group,
                 keys[10] .. ":" .. group, keys[11] .. ":" .. group},
    group = group,
    cweight = cweight,
    groupReady = base .. ":gready:" .. group,
    callers = base .. ":callers:" .. cweight,
    callerServed = base .. ":caller:served",
    vtime = base .. ":caller:vtime",
    groups = base .. ":groups",
  }
end

--[[
  deviceKeys(base, mac, weight) -> keys
  The KEYS[1..11] block of a device named inside a script (claimDevices), as Keys.device builds it in Python.
]]
local function deviceKeys(base, mac, weight)
  local out = {base .. ":meta:" .. mac}
  for p = 1, 5 do out[#out + 1] = base .. ":q:" .. mac .. ":" .. p end
  for p = 1, 5 do out[#out + 1] = base .. ":sched:" .. p .. ":" .. weight end
  return out
end
