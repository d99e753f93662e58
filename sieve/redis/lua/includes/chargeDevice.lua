--[[
  chargeDevice(meta_key, mac, ms)
  Fair by cost: moves the start of the device's wait by `ms` (later for tasks that cost more than the average
  of their type, earlier for cheaper ones; scheduler_svc/cost.py works it out), as if its last service had
  happened that much later. A device in a schedule set moves within it (and within its group's ready set); its
  wait never starts before its oldest task's enqueue time, so a credit is bounded by what it really waited. A
  device whose meta is gone (nothing queued or outstanding) has nothing to charge.
]]
local function chargeDevice(metaKey, mac, ms)
  if ms == 0 then return end
  local m = redis.call("HMGET", metaKey, "state", "class", "weight", "group", "last_served_ms", "oldest_ms")
  if not m[1] then return end
  local served = tonumber(m[5] or "0") + ms
  redis.call("HSET", metaKey, "last_served_ms", served)
  local class = tonumber(m[2] or "0")
  if m[1] ~= "ready" or class == 0 then return end
  local since = tonumber(m[6] or "0")
  if served > since then since = served end
  local base = string.match(metaKey, "^(%b{})")
  local group = m[4] or "-"
  redis.call("ZADD", base .. ":sched:" .. class .. ":" .. (m[3] or "1") .. ":" .. group, "XX", since, mac)
  redis.call("ZADD", base .. ":gready:" .. group, "XX", since, mac)
  redis.call("HSET", metaKey, "since_ms", since)
end
