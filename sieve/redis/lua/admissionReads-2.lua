--[[
  What admission control reads before a submit is written, in one call: the global pending count, the caller's
  open tasks and each device's backlog (read-only). A SubmitBatch over 500 devices is one command, not 502; the
  device meta keys are named in the script from the hash tag.

  Input:
    KEYS[1]      pendingKey     global pending counter
    KEYS[2]      callerKey      caller counts (caller -> open tasks)

    ARGV[1]      caller         the caller whose open tasks to read ("" for none)
    ARGV[2]      base           the keys' hash tag ("{prefix}")
    ARGV[3..]    macs           the devices (normalised MACs)

  Output:
    {pending, caller open (0 for ""), backlog_1, ..., backlog_n}
]]
--@requires slice

local pendingKey = KEYS[1]
local callerKey = KEYS[2]
local caller = ARGV[1]
local base = ARGV[2]
local macs = slice(ARGV, 3)

local out = {tonumber(redis.call("GET", pendingKey) or "0"), 0}
if caller ~= "" then out[2] = tonumber(redis.call("HGET", callerKey, caller) or "0") end
for _, mac in ipairs(macs) do
  out[#out + 1] = tonumber(redis.call("HGET", base .. ":meta:" .. mac, "backlog") or "0")
end
return out
