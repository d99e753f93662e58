--[[
  Puts a device's delayed tasks whose time has come back at the front of its queues (oldest first
  ends up first), and schedules the device if it is idle.

  Input:
    KEYS[1..11]  device       device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     pendingKey   global pending counter
    KEYS[13]     delayedKey   delayed set ("mac|entry" -> due ms)
    KEYS[14]     devicesKey   active devices set

    ARGV[1]      now          now (ms)
    ARGV[2]      mac          device (normalised MAC)
    ARGV[3..]    members      delayed members of this device ("mac|entry"), most recently due last

  Output:
    number of tasks put back (members already gone are skipped)
]]
--@requires slice, deviceBlock, parseEntry, countOutstanding, settleReturned

local now = tonumber(ARGV[1])
local mac = ARGV[2]
local members = slice(ARGV, 3)
local device = deviceBlock(KEYS, mac)
local pendingKey = KEYS[12]
local delayedKey = KEYS[13]
local devicesKey = KEYS[14]

local back = 0
for i = #members, 1, -1 do
  local member = members[i]
  local due = redis.call("ZSCORE", delayedKey, member)
  if due and tonumber(due) <= now and redis.call("ZREM", delayedKey, member) == 1 then
    local e = parseEntry(string.sub(member, #mac + 2))
    redis.call("LPUSH", device.queues[e.prio], encodeEntry(e))
    back = back + 1
  end
end
countOutstanding(device.meta, -back)
settleReturned(device, back, pendingKey, devicesKey, now)
return back
