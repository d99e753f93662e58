--[[
  Renews the leases of the slots a holder process still uses: each listed holder that still holds a slot gets a
  new deadline; one whose lease was already reclaimed is not given a slot back (it must acquire again).

  Input:
    KEYS[1]      poolKey       the pool's holders (zset: holder -> lease deadline, ms)

    ARGV[1]      now           now (ms), or "" for Redis's clock
    ARGV[2]      leaseMs       the new lease (ms, > 0)
    ARGV[3..]    holders       the holders to renew

  Output:
    lost         the listed holders that no longer held a slot (their lease had expired)
]]
--@requires slice, nowMs

local poolKey = KEYS[1]
local now = nowMs(ARGV[1])
local leaseMs = tonumber(ARGV[2])
local holders = slice(ARGV, 3)

local lost = {}
for _, holder in ipairs(holders) do
  local deadline = tonumber(redis.call("ZSCORE", poolKey, holder))
  if deadline and deadline > now then
    redis.call("ZADD", poolKey, now + leaseMs, holder)
  else
    if deadline then redis.call("ZREM", poolKey, holder) end
    table.insert(lost, holder)
  end
end
return lost
