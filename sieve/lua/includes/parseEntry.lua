--[[
  parseEntry(s) -> table
  Splits a queue entry "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers" into its fields.
]]
local function parseEntry(s)
  local id, ty, prio, enq, exp, attempt, defers =
    string.match(s, "^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$")
  return {
    id = id, type = ty, prio = tonumber(prio), enq = tonumber(enq), exp = tonumber(exp),
    attempt = tonumber(attempt), defers = tonumber(defers),
  }
end

local function encodeEntry(e)
  return e.id .. "|" .. e.type .. "|" .. e.prio .. "|" .. e.enq .. "|" .. e.exp .. "|" .. e.attempt ..
    "|" .. e.defers
end
