--[[
  Puts a device's delayed tasks whose time has come back at the front of its queues (oldest first
  ends up first), and schedules the device if it is idle.

  Input:
    KEYS[1..11]  device block
    KEYS[12]     global pending counter
    KEYS[13]     delayed set ("mac|entry" -> due ms)
    KEYS[14]     active devices set

    ARGV[1]      now (ms)
    ARGV[2]      device (normalised MAC)
    ARGV[3..]    delayed members of this device ("mac|entry"), most recently due last

  Output:
    number of tasks put back (members already gone are skipped)
]]
--- @include "parseEntry"
--- @include "deviceHeads"
--- @include "scheduleDevice"
--- @include "settleReturned"
--- @include "countOutstanding"

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local back = 0
for i = #ARGV, 3, -1 do
  local member = ARGV[i]
  local due = redis.call("ZSCORE", KEYS[13], member)
  if due and tonumber(due) <= now and redis.call("ZREM", KEYS[13], member) == 1 then
    local e = parseEntry(string.sub(member, #mac + 2))
    redis.call("LPUSH", KEYS[1 + e.prio], encodeEntry(e))
    back = back + 1
  end
end
countOutstanding(KEYS[1], -back)
settleReturned(mac, back, KEYS[12], KEYS[14], now)
return back
