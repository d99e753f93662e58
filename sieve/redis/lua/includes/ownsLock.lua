--[[
  ownsLock(lock_key, token) -> holder value | false, owned
  Whether `token` holds the device's dispatch lock. A lock that expired still counts as the caller's
  while the device's meta (KEYS[1]) carries the token and nobody else took it.
]]
local function ownsLock(lockKey, token)
  local holder = redis.call("GET", lockKey)
  local owned = holder == token or (holder == false and redis.call("HGET", KEYS[1], "token") == token)
  return holder, owned
end
