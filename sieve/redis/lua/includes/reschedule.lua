--[[
  reschedule(device, now_ms, devices_key) -> "ready" | "idle"
  scheduleDevice, and a device it leaves idle leaves the active devices set (it has no queued work).
]]
--@requires scheduleDevice
local function reschedule(device, now, devicesKey)
  local became = scheduleDevice(device, now)
  if became == "idle" then redis.call("SREM", devicesKey, device.mac) else device.rescheduled = true end
  return became
end
