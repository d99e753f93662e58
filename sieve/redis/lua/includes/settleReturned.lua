--[[
  settleReturned(mac, back, pending_key, devices_key, now_ms)
  After `back` tasks were pushed back onto the device's queues (KEYS[2..6]): counts them in its backlog and
  the global pending counter, marks the device active and schedules it unless it is being served or
  backing off (releaseDevice / resumeDevice do it then). Uses KEYS[1..11].
  Needs: parseEntry, deviceHeads, scheduleDevice.
]]
local function settleReturned(mac, back, pendingKey, devicesKey, now)
  if back == 0 then return end
  redis.call("HINCRBY", KEYS[1], "backlog", back)
  redis.call("INCRBY", pendingKey, back)
  redis.call("SADD", devicesKey, mac)
  local state = redis.call("HGET", KEYS[1], "state")
  if state == false or state == "idle" or state == "ready" then
    scheduleDevice(mac, now)
  end
end
