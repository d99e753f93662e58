--[[
  One scheduler replica's step in dividing the shards between the replicas (sieve/redis/shard_leases.py), in one
  atomic call: it renews the shard leases it holds, gives back those beyond its target (the highest shards first),
  then takes free ones (from `first` on, round the ring) until it holds its target. A lease is a key per shard
  holding its replica's id, with a TTL: a replica that dies stops renewing, and its shards are free once it ran out.

  Input:
    KEYS[1..n]   leaseKeys   the lease key of every shard, shard 0 first (Keys.shard_lease; all under the global tag)
    ARGV[1]      owner       this replica's id
    ARGV[2]      ttl         lease ttl (ms)
    ARGV[3]      target      how many shards this replica should hold (0: give every one back)
    ARGV[4]      first       the shard to start looking for free ones at (0-based)

  Output:
    {shard, ...}  the shards (0-based) this replica holds after the call
]]

local leaseKeys = KEYS
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local target = tonumber(ARGV[3])
local first = tonumber(ARGV[4])

local n = #leaseKeys
local held = {}
for i = 1, n do
  if redis.call("GET", leaseKeys[i]) == owner then held[#held + 1] = i end
end
while #held > target do
  redis.call("DEL", leaseKeys[held[#held]])
  held[#held] = nil
end
for _, i in ipairs(held) do redis.call("PEXPIRE", leaseKeys[i], ttl) end
local step = 0
while #held < target and step < n do
  local i = (first + step) % n + 1
  if redis.call("SET", leaseKeys[i], owner, "NX", "PX", ttl) then held[#held + 1] = i end
  step = step + 1
end
table.sort(held)
local out = {}
for _, i in ipairs(held) do out[#out + 1] = i - 1 end
return out
