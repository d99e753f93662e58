--[[
  Claims one device for serving and takes up to n tasks from it, in one atomic step (popDevice says how).

  Popping stops before a task whose type is not allowed (no connected worker has room for it): the caller
  then backs the device off or serves it later. With release=1 the dispatch ends in the same step (lock
  dropped, device rescheduled with its wait restarting now), which is what a dispatcher does when every task
  it took has a worker waiting for it. claimDevices does the same for the next devices of the fair order.

  Input:
    KEYS[1..11]  device         device block (deviceBlock: meta, queues 1..5, schedule sets 1..5 of its weight)
    KEYS[12]     lockKey        device dispatch lock
    KEYS[13]     pendingKey     global pending counter
    KEYS[14]     servingKey     serving set
    KEYS[15]     leasesKey      leases (task_id -> deadline ms)
    KEYS[16]     leaseDataKey   lease data (task_id -> "mac|entry")
    KEYS[17]     overloadedKey  overloaded devices set
    KEYS[18]     devicesKey     active devices set
    KEYS[19]     callerKey      caller counts (caller -> open tasks; an expired task dropped here is no longer open)

    ARGV[1]      now            now (ms)
    ARGV[2]      token          lock token
    ARGV[3]      lockTtl        lock ttl (ms)
    ARGV[4]      want           most tasks to take
    ARGV[5]      maxWait        max_wait (ms)
    ARGV[6]      leaseTtl       lease ttl (ms)
    ARGV[7]      mac            device (normalised MAC)
    ARGV[8]      maxPerDevice   per-device pending limit (the overloaded mark is cleared below it)
    ARGV[9]      allowedTypes   allowed task types, comma separated ("" for any, "-" for none; "type:n" allows
                                n tasks of the type)
    ARGV[10]     release        1 to release the device in the same step, 0 to keep it locked for releaseDevice
    ARGV[11]     carriedWait    wait carried over (ms): the device's wait restarts at now - this (see rankDevices)
    ARGV[12]     msPerTask      what one task is worth to its caller's virtual start (ms; callerGroup)

  Output:
    {OK, taken, blocked, e1..e_taken, x1..x_m}
                                       entries taken (attempt raised), then entries dropped as expired;
                                       blocked = the type of the task popping stopped at (not allowed), or 0
    {LOCK_HELD}                        the device's lock is already held (by another dispatch)
    {DEVICE_NOT_READY}                 the device is not schedulable (taken by another replica, idle, backoff)
    (codes: includes/codes.lua)
]]
--@requires codes, deviceBlock, popDevice

local now = tonumber(ARGV[1])
local token = ARGV[2]
local lockTtl = ARGV[3]
local want = tonumber(ARGV[4])
local maxWait = tonumber(ARGV[5])
local leaseTtl = tonumber(ARGV[6])
local mac = ARGV[7]
local maxPerDevice = tonumber(ARGV[8])
local allowedTypes = ARGV[9]
local release = ARGV[10] == "1"
local carriedWait = tonumber(ARGV[11] or "0")
local msPerTask = tonumber(ARGV[12] or "1")
local device = deviceBlock(KEYS, mac)
local lockKey = KEYS[12]
local pendingKey = KEYS[13]
local servingKey = KEYS[14]
local leasesKey = KEYS[15]
local leaseDataKey = KEYS[16]
local overloadedKey = KEYS[17]
local devicesKey = KEYS[18]
local callerKey = KEYS[19]

local g = {pending = pendingKey, serving = servingKey, leases = leasesKey, leaseData = leaseDataKey,
           overloaded = overloadedKey, devices = devicesKey, caller = callerKey}
local a = {now = now, token = token, lockTtl = lockTtl, want = want, maxWait = maxWait, leaseTtl = leaseTtl,
           maxPerDevice = maxPerDevice, budget = parseBudget(allowedTypes), release = release,
           carriedWait = carriedWait, msPerTask = msPerTask}
local code, taken, expired, blocked = popDevice(device, lockKey, g, a)
flushCallerGroups()
if code ~= CODE.OK then return {code} end

local out = {CODE.OK, #taken, blocked}
for _, v in ipairs(taken) do out[#out + 1] = v end
for _, v in ipairs(expired) do out[#out + 1] = v end
return out
