--[[
  countBack(device, back, pending_key)
  Counts `back` tasks pushed back onto the device's queues in its backlog and in the global pending counter
  (nothing when 0).
]]
local function countBack(device, back, pendingKey)
  if back == 0 then return end
  redis.call("HINCRBY", device.meta, "backlog", back)
  redis.call("INCRBY", pendingKey, back)
end
