--[[
  settleAcked(meta_key, acked) -> true when forgotten
  A device's `acked` tasks are settled: countOutstanding(meta_key, -acked) then forgetIdle(meta_key), with one
  read of the meta (a device left idle with nothing queued and nothing outstanding is deleted at once). With
  acked 0 it is forgetIdle alone.
]]
local function settleAcked(metaKey, acked)
  local m = redis.call("HMGET", metaKey, "state", "backlog", "outstanding")
  local left = tonumber(m[3] or "0") - acked
  if (m[1] == false or m[1] == "idle") and tonumber(m[2] or "0") <= 0 and left <= 0 then
    redis.call("DEL", metaKey)
    return true
  end
  if acked == 0 then return false end
  if left > 0 then
    redis.call("HSET", metaKey, "outstanding", left)
  elseif m[3] then
    redis.call("HDEL", metaKey, "outstanding")
  end
  return false
end
