--[[
  deviceHeads(device) -> oldest_enqueued_ms | false, best_priority | 0
  Reads the head of each of the device's queues (priority 1..5): the oldest enqueue time among them and the
  highest priority that has work. With device.sizes (the queues' lengths, when the caller knows them) only the
  queues that hold something are read; with device.heads (the head of a queue, when the caller just pushed it
  to an empty one) not even those.
]]
--@requires parseEntry
local function deviceHeads(device)
  local oldest = false
  local best = 0
  local sizes, heads = device.sizes, device.heads
  device.heads = nil
  for p = 1, 5 do
    local head = (heads and heads[p]) or ((not sizes or sizes[p] > 0) and redis.call("LINDEX", device.queues[p], 0))
    if head then
      local e = parseEntry(head)
      if (not oldest) or e.enq < oldest then oldest = e.enq end
      best = p
    end
  end
  return oldest, best
end
