--[[
  countOutstanding(meta_key, delta) -> the count left (nil for delta 0)
  Adds delta to a device's `outstanding` (its meta hash's count of tasks taken out of its queues and not settled
  yet: leased or delayed), never below 0; at 0 the field goes (and with it a meta that held nothing else). A
  device with nothing queued and nothing outstanding forgets its meta (scheduleDevice, forgetIdle): per-device
  state lasts only while the device has work.
]]
local function countOutstanding(metaKey, delta)
  if delta == 0 then return nil end
  local left = redis.call("HINCRBY", metaKey, "outstanding", delta)
  if left <= 0 then redis.call("HDEL", metaKey, "outstanding") end
  return left
end
