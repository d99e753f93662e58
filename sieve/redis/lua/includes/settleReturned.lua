--[[
  settleReturned(device, back, pending_key, devices_key, now_ms)
  After `back` tasks were pushed back onto the device's queues: counts them (countBack), marks the device
  active and schedules it unless it is being served or backing off (releaseDevice / resumeDevice do it then).
]]
--@requires countBack, scheduleDevice
local function settleReturned(device, back, pendingKey, devicesKey, now)
  if back == 0 then return end
  countBack(device, back, pendingKey)
  redis.call("SADD", devicesKey, device.mac)
  local state = redis.call("HGET", device.meta, "state")
  if state == false or state == "idle" or state == "ready" then
    scheduleDevice(device, now)
  end
end
