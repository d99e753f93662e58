--[[
  CODE: the status codes the scripts return, as a reply of its own or as a reply's first element. The same
  table as Python's sieve.errors.ScriptCode, which the queue store branches on by name
  (tests/unit/sieve/redis/test_lua_loader.py fails when the two differ).
]]
local CODE = {
  OK = 1,                -- the state change was made
  GLOBAL_LIMIT = -1,     -- enqueueMany refused: the global pending limit would be exceeded
  DEVICE_LIMIT = -2,     -- enqueueMany refused: the device's pending limit would be exceeded
  DEVICE_NOT_READY = -3, -- popBatch: the device is not schedulable (taken by another replica, idle, backoff)
  REDIS_NOT_READY = -4,  -- enqueueMany refused: Redis lost its memory and the queues are not rebuilt yet
  CALLER_LIMIT = -5,     -- enqueueMany refused: a caller's limit of open tasks would be exceeded
  LOCK_NOT_OWNED = -6,   -- releaseDevice, deferDevice, deferTypes: another token holds the device's lock
  LOCK_HELD = -7,        -- popBatch: the device's lock is already held (nothing claimed)
  DEVICES_CHANGED = -8,  -- recountPending: a device became active since the caller read them
}
