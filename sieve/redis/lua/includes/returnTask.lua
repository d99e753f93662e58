--[[
  returnTask(way, entry, exhausted, due_ms | false) -> "dead", record | "delayed" | "back"
  Where a task taken out of its lease (takeLease) or its queue goes next:
  - exhausted (its counted attempts or its put-backs reached the limit): dead-lettered (deadLetter, with
    way.reason), and no longer open for its caller;
  - else with a due time: into the delayed set until then, outstanding again for its device (promoteDelayed
    brings it back to the front of its queue);
  - else: back at the front of its queue; the caller counts the tasks it pushed back (countBack,
    settleReturned).
  way: {device, now, deadKey, deadKeep, reason, callerKey, delayedKey (only where tasks are delayed)}.
]]
--@requires parseEntry, deadLetter, countCaller, countOutstanding
local function returnTask(way, e, exhausted, due)
  if exhausted then
    local record = deadLetter(way.deadKey, way.deadKeep, way.device.mac, e, way.reason, way.now)
    countCaller(way.callerKey, e, -1)
    return "dead", record
  end
  if due then
    redis.call("ZADD", way.delayedKey, due, way.device.mac .. "|" .. encodeEntry(e))
    countOutstanding(way.device.meta, 1)
    return "delayed"
  end
  redis.call("LPUSH", way.device.queues[e.prio], encodeEntry(e))
  return "back"
end
