--[[
  parseEntry(s) -> table
  Splits a queue entry "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers" into its fields.
]]
local function parseEntry(s)
  local f = {}
  local start = 1
  while true do
    local sep = string.find(s, "|", start, true)
    if not sep then
      f[#f + 1] = string.sub(s, start)
      break
    end
    f[#f + 1] = string.sub(s, start, sep - 1)
    start = sep + 1
  end
  return {
    id = f[1], type = f[2], prio = tonumber(f[3]), enq = tonumber(f[4]), exp = tonumber(f[5]),
    attempt = tonumber(f[6]), defers = tonumber(f[7]),
  }
end

local function encodeEntry(e)
  return e.id .. "|" .. e.type .. "|" .. e.prio .. "|" .. e.enq .. "|" .. e.exp .. "|" .. e.attempt ..
    "|" .. e.defers
end
