--[[
  ownsLock(device, lock_key, token) -> holder value | false, owned
  Whether `token` holds the device's dispatch lock. A lock that expired still counts as the caller's while the
  device's meta carries the token and nobody else took it.
]]
local function ownsLock(device, lockKey, token)
  local holder = redis.call("GET", lockKey)
  local owned = holder == token or (holder == false and redis.call("HGET", device.meta, "token") == token)
  return holder, owned
end
