--[[
  parseEntry(s) -> table
  Splits a queue entry "task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace[|caller]" into
  its fields (trace: the W3C traceparent of the Submit that created the task, or empty; caller: the name of the
  principal that submitted it, last so that it may hold any character; absent in entries queued before callers
  were recorded, and then "").
  attempt counts hand-outs and never goes down (it is the lease's fencing token); failures counts the
  attempts that count towards dead-lettering; defers counts put-backs because no worker could take it.
]]
local function parseEntry(s)
  local id, ty, prio, enq, exp, attempt, defers, failures, trace, caller =
    string.match(s, "^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$")
  if not id then
    id, ty, prio, enq, exp, attempt, defers, failures, trace =
      string.match(s, "^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$")
    caller = ""
  end
  return {
    id = id, type = ty, prio = tonumber(prio), enq = tonumber(enq), exp = tonumber(exp),
    attempt = tonumber(attempt), defers = tonumber(defers), failures = tonumber(failures), trace = trace,
    caller = caller,
  }
end

local function encodeEntry(e)
  local s = e.id .. "|" .. e.type .. "|" .. e.prio .. "|" .. e.enq .. "|" .. e.exp .. "|" .. e.attempt ..
    "|" .. e.defers .. "|" .. e.failures .. "|" .. e.trace
  if e.caller ~= "" then s = s .. "|" .. e.caller end
  return s
end
