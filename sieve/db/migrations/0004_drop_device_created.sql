-- No query reads tasks by (device, created_at); the index only cost every status change an index write.
DROP INDEX IF EXISTS tasks_device_created;
