--[[
  Finishes leased tasks: each lease is removed only when the ack's attempt (the fencing token) is the
  lease's current one; an ack of a stale or unknown lease changes nothing.

  Input:
    KEYS[1]      leases (task_id -> deadline ms)
    KEYS[2]      lease data (task_id -> "mac|entry")
    KEYS[3]      caller counts (caller -> open tasks; an acked task is no longer open)

    ARGV[1..]    pairs: task_id, attempt

  Output:
    {r1, r2, ...}  per pair: 1 acked, 0 refused (stale attempt or no such lease)
]]
--- @include "parseEntry"
--- @include "countCaller"

local out = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local v = redis.call("HGET", KEYS[2], id)
  local ok = 0
  if v then
    local sep = string.find(v, "|", 1, true)
    local e = parseEntry(string.sub(v, sep + 1))
    if tostring(e.attempt) == ARGV[i + 1] then
      redis.call("HDEL", KEYS[2], id)
      redis.call("ZREM", KEYS[1], id)
      countCaller(KEYS[3], e, -1)
      ok = 1
    end
  end
  out[#out + 1] = ok
end
return out
