--[[
  takeLease(device, leases_key, lease_data_key, task_id, token) -> entry table | nil
  Removes the lease of a task of this device and returns its entry, when the token ("*" for any) is the
  lease's attempt. A lease of another device, another attempt, or none at all is left alone (nil). A lease
  taken is no longer outstanding for the device: the caller counts it again if it delays it (returnTask).
]]
--@requires parseEntry, countOutstanding
local function takeLease(device, leasesKey, dataKey, id, token)
  local mac = device.mac
  local v = redis.call("HGET", dataKey, id)
  if not v or string.sub(v, 1, #mac + 1) ~= mac .. "|" then return nil end
  local e = parseEntry(string.sub(v, #mac + 2))
  if token ~= "*" and tostring(e.attempt) ~= token then return nil end
  redis.call("HDEL", dataKey, id)
  redis.call("ZREM", leasesKey, id)
  countOutstanding(device.meta, -1)
  return e
end
