--[[
  deviceHeads(device) -> oldest_enqueued_ms | false, best_priority | 0
  Reads the head of each of the device's queues (priority 1..5): the oldest enqueue time among them and the
  highest priority that has work.
]]
--@requires parseEntry
local function deviceHeads(device)
  local oldest = false
  local best = 0
  for p = 1, 5 do
    local head = redis.call("LINDEX", device.queues[p], 0)
    if head then
      local e = parseEntry(head)
      if (not oldest) or e.enq < oldest then oldest = e.enq end
      best = p
    end
  end
  return oldest, best
end
