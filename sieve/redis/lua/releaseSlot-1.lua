--[[
  Gives back one holder's slot of a pool (a job that is terminal at the provider, or between two stages).
  Releasing a slot that is not held (already released, or reclaimed after its lease) changes nothing.

  Input:
    KEYS[1]      poolKey       the pool's holders (zset: holder -> lease deadline, ms)

    ARGV[1]      holder        whose slot is given back

  Output:
    released     1 when the holder held a slot, 0 when it did not
]]
local poolKey = KEYS[1]
local holder = ARGV[1]

return redis.call("ZREM", poolKey, holder)
