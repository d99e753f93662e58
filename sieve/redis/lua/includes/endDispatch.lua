--[[
  endDispatch(device, lock_key, serving_key)
  Ends a device's dispatch: drops its dispatch lock (DEL of a lock that expired changes nothing), its mark in the
  serving set and the lock token in its meta. The caller schedules the device again (reschedule) or backs it
  off.
]]
local function endDispatch(device, lockKey, servingKey)
  redis.call("DEL", lockKey)
  redis.call("ZREM", servingKey, device.mac)
  redis.call("HDEL", device.meta, "token")
end
