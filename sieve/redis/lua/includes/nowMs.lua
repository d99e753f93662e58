--[[
  nowMs(given) -> number
  The time a script works at, in ms: `given` (an ARGV a caller passed, for tests and replays) when it is a number,
  else Redis's own clock.
]]
local function nowMs(given)
  local now = tonumber(given)
  if now then return now end
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
