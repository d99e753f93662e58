--[[
  forgetIdle(meta_key) -> true when forgotten
  Deletes the meta hash of a device that is idle (or has no state), with nothing queued (backlog 0) and nothing
  outstanding (no lease, no delayed task): such a meta says nothing a missing one does not. A device being
  served or backing off keeps its meta.
]]
local function forgetIdle(metaKey)
  local m = redis.call("HMGET", metaKey, "state", "backlog", "outstanding")
  if (m[1] == false or m[1] == "idle") and tonumber(m[2] or "0") <= 0 and tonumber(m[3] or "0") <= 0 then
    redis.call("DEL", metaKey)
    return true
  end
  return false
end
