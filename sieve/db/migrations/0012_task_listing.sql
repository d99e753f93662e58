-- ListTasks (sieve/db/task_listing.py) pages through a caller's tasks, or one device's, newest first by id (ids
-- are UUIDv7: ordered by creation time), in keyset pages: each page is a range scan of one of these indexes from
-- the last id of the page before (an operator's list of every caller's tasks uses the primary key). On the table
-- partitioned by id (0008) these are partitioned indexes: each day's partition has its own.
CREATE INDEX tasks_caller_id ON tasks (caller, id);
CREATE INDEX tasks_device_id ON tasks (device, id);
