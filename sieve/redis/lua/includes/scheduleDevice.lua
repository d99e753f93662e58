--[[
  scheduleDevice(mac, now_ms) -> "ready" | "idle"
  Puts a device that is not being served into the schedule set of its best priority (KEYS[6 + prio]),
  scored by the time its wait started: max(oldest task's enqueue time, last time it was served).
  A device with no queued work becomes idle; with nothing outstanding either (no lease, no delayed task:
  countOutstanding) its meta is deleted instead (it would say nothing a missing one does not).
  Uses KEYS[1] (meta) and KEYS[2..11].
  Needs: parseEntry, deviceHeads.
]]
local function scheduleDevice(mac, now)
  local oldest, best = deviceHeads()
  local previous = tonumber(redis.call("HGET", KEYS[1], "class") or "0")
  if previous > 0 then redis.call("ZREM", KEYS[6 + previous], mac) end
  if best == 0 then
    if tonumber(redis.call("HGET", KEYS[1], "outstanding") or "0") > 0 then
      redis.call("HSET", KEYS[1], "state", "idle", "class", 0, "backlog", 0)
      redis.call("HDEL", KEYS[1], "oldest_ms")
    else
      redis.call("DEL", KEYS[1])
    end
    return "idle"
  end
  local served = tonumber(redis.call("HGET", KEYS[1], "last_served_ms") or "0")
  local since = oldest
  if served > since then since = served end
  redis.call("ZADD", KEYS[6 + best], since, mac)
  redis.call("HSET", KEYS[1], "state", "ready", "class", best, "oldest_ms", oldest, "since_ms", since)
  return "ready"
end
