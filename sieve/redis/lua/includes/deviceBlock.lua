--[[
  deviceBlock(keys, mac) -> device
  The device block that every device script takes as its KEYS[1..11] (sieve/redis/keys.py, DeviceKeys.block),
  as a table: device.mac; device.meta, its meta hash; device.queues[p], its queue of priority p (1..5);
  device.schedules[p], the schedule set of priority p for the device's weight.
]]
local function deviceBlock(keys, mac)
  return {
    mac = mac,
    meta = keys[1],
    queues = {keys[2], keys[3], keys[4], keys[5], keys[6]},
    schedules = {keys[7], keys[8], keys[9], keys[10], keys[11]},
  }
end
