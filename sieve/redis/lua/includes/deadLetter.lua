--[[
  deadLetter(dead_key, keep, mac, entry, error, now_ms) -> json
  Pushes a dead-letter record to the front of the capped list and returns it. Its fields are what an operator
  reads about a task that will not be tried again: its id, device, type and priority, the error, its counted
  attempts, its hand-outs, its put-backs (requeue_count), when it was enqueued and when it died.
]]
local function deadLetter(deadKey, keep, mac, e, err, now)
  local record = cjson.encode({
    task_id = e.id, device = mac, task_type = tonumber(e.type), priority = e.prio, error = err,
    attempts = e.failures, handouts = e.attempt, requeue_count = e.defers, enqueued_ms = e.enq, dead_ms = now,
  })
  redis.call("LPUSH", deadKey, record)
  redis.call("LTRIM", deadKey, 0, keep - 1)
  return record
end
