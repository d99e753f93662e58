--[[
  deviceBlock(keys, mac[, group, cweight, fields]) -> device
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
  `fields`: more meta fields read in the same HMGET, for the step that follows (device.read, in that order,
  device.readOf the list itself: popDevice and enqueueDevice read POP_FIELDS and ENQUEUE_FIELDS so).
]]
-- names[p] built when first read (prefix .. p .. suffix): a script touches one or two of a device's five queues
-- and schedule sets, and building every name of every device it serves is most of a claim's Lua time
local LAZY_NAMES = {__index = function(names, p)
  local name = names.prefix .. p .. names.suffix
  rawset(names, p, name)
  return name
end}
local function lazyNames(prefix, suffix)
  return setmetatable({prefix = prefix, suffix = suffix}, LAZY_NAMES)
end

-- the names that depend only on the hash tag, a group or a caller weight, built once per script call
local sharedNames = {}
local function sharedName(base, kind, what)
  local names = sharedNames[base]
  if not names then
    names = {}
    sharedNames[base] = names
  end
  local key = kind .. what
  local name = names[key]
  if not name then
    name = base .. kind .. what
    names[key] = name
  end
  return name
end

local function deviceBlock(keys, mac, group, cweight, fields)
  local meta = keys[1]
  local known = redis.call("HMGET", meta, "group", "cweight", unpack(fields or {}))
  group = known[1] or group or "-"
  if group == "" then group = "-" end
  cweight = known[2] or cweight or "1"
  local base = keys.base or string.match(meta, "^(%b{})")
  local queues, schedules
  if keys.base then -- named in the script (deviceKeys): build what is read
    queues = lazyNames(base .. ":q:" .. mac .. ":", "")
    schedules = lazyNames(base .. ":sched:", ":" .. keys.weight .. ":" .. group)
  else
    queues = {keys[2], keys[3], keys[4], keys[5], keys[6]}
    schedules = {keys[7] .. ":" .. group, keys[8] .. ":" .. group, keys[9] .. ":" .. group,
                 keys[10] .. ":" .. group, keys[11] .. ":" .. group}
  end
  local read = nil
  if fields then
    read = {}
    for i = 1, #fields do read[i] = known[i + 2] end
  end
  return {
    mac = mac,
    meta = meta,
    -- the meta's `fields` as read with its group (read: fields the caller asked for, in their order; readOf: the
    -- list asked for, by which a script's step knows the values are the ones it wants)
    read = read,
    readOf = fields,
    queues = queues,
    schedules = schedules,
    group = group,
    cweight = cweight,
    groupReady = sharedName(base, ":gready:", group),
    callers = sharedName(base, ":callers:", cweight),
    callerServed = sharedName(base, ":caller:", "served"),
    vtime = sharedName(base, ":caller:", "vtime"),
    groups = sharedName(base, ":", "groups"),
  }
end

--[[
  deviceKeys(base, mac, weight) -> keys
  The KEYS[1..11] block of a device named inside a script (claimDevices, enqueueMany), as Keys.device builds it
  in Python: its meta hash's name, and what deviceBlock names the queues and schedule sets from when one is read.
]]
local function deviceKeys(base, mac, weight)
  -- KEYS[2..11] are named when deviceBlock's tables are read: base and weight say how
  return {base .. ":meta:" .. mac, base = base, weight = weight}
end
