--[[
  forgetIdle(meta_key) -> true when forgotten
  Deletes the meta hash of a device that is idle (or has no state), with nothing queued (backlog 0) and nothing
  outstanding (no lease, no delayed task): such a meta says nothing a missing one does not. A device being
  served or backing off keeps its meta.
]]
--@requires settleAcked
local function forgetIdle(metaKey)
  return settleAcked(metaKey, 0)
end
