--[[
  deviceFacts(device, lock_key, serving_key, backoff_key, devices_key) -> queued, backlog, state, problem
  What a device's own keys say, and whether they agree: the entries in its queues against its meta's backlog,
  its state against its schedule sets, its lock, the serving set, the backoff set and the active devices set.
  Every script keeps these in step, so a problem means Redis lost something behind Sieve's back (a deleted or
  evicted key, a lost write).
  problem is "" or one of: "backlog" (the count differs from the queues), "no state" (queued work, no meta),
  "idle with work", "not active" (queued work, not in the active set), "stale schedule" (in a schedule set it
  does not belong to), "not scheduled" (ready, in no schedule set), "abandoned" (serving with no lock, in no
  serving set), "backoff lost" (backing off, in no backoff set).
]]
local function deviceFacts(device, lockKey, servingKey, backoffKey, devicesKey)
  local mac = device.mac
  local queued = 0
  for p = 1, 5 do queued = queued + redis.call("LLEN", device.queues[p]) end
  local meta = redis.call("HMGET", device.meta, "state", "class", "backlog")
  local state, class, backlog = meta[1], tonumber(meta[2] or "0"), tonumber(meta[3] or "0")
  local problem = ""
  if backlog ~= queued then problem = "backlog" end
  if queued > 0 then
    if state == false then problem = "no state" elseif state == "idle" then problem = "idle with work" end
    if redis.call("SISMEMBER", devicesKey, mac) == 0 then problem = "not active" end
  end
  local scheduled = false
  for p = 1, 5 do
    if redis.call("ZSCORE", device.schedules[p], mac) then
      if state ~= "ready" or class ~= p then problem = "stale schedule" else scheduled = true end
    end
  end
  if state == "ready" and not scheduled then problem = "not scheduled" end
  if state == "serving" and redis.call("EXISTS", lockKey) == 0 and not redis.call("ZSCORE", servingKey, mac) then
    problem = "abandoned"
  end
  if state == "backoff" and not redis.call("ZSCORE", backoffKey, mac) then problem = "backoff lost" end
  return queued, backlog, state, problem
end
