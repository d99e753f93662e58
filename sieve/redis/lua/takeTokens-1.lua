--[[
  Takes submit tokens from one caller's token bucket: the bucket holds at most `burst` tokens and refills
  at `rate` tokens per second; each task submitted costs one. As many of the `wanted` tokens as the bucket
  holds are granted (the first tasks of a batch get in, the rest are refused). Time is Redis's own clock
  (TIME) unless one is given, so that every intake replica refills the same bucket by the same clock. The
  key expires once the bucket would be full again (a full bucket and no bucket are the same).

  Input:
    KEYS[1]      bucketKey     the caller's bucket (hash: tokens, ts_ms)

    ARGV[1]      now           now (ms), or "" for Redis's clock
    ARGV[2]      rate          rate (tokens per second, > 0)
    ARGV[3]      burst         burst (bucket size, >= 1)
    ARGV[4]      wanted        tokens wanted (>= 1)

  Output:
    {granted, wait_ms}   granted: tokens taken (0..wanted); wait_ms: 0 when all were granted, else the time
                         until the bucket holds the refused rest again (at most burst of them), rounded up
]]
--@requires nowMs
local bucketKey = KEYS[1]
local now = nowMs(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local wanted = tonumber(ARGV[4])

local state = redis.call("HMGET", bucketKey, "tokens", "ts_ms")
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if not tokens or not ts then
  tokens, ts = burst, now
end
if now > ts then
  tokens = tokens + (now - ts) * rate / 1000
  ts = now
end
if tokens > burst then tokens = burst end

local granted = math.min(wanted, math.floor(tokens))
tokens = tokens - granted
local wait = 0
if granted < wanted then
  wait = math.ceil((math.min(wanted - granted, burst) - tokens) * 1000 / rate)
  if wait < 1 then wait = 1 end
end
redis.call("HSET", bucketKey, "tokens", string.format("%.6f", tokens), "ts_ms", ts)
redis.call("PEXPIRE", bucketKey, math.ceil((burst - tokens) * 1000 / rate) + 1000)
return {granted, wait}
