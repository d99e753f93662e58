-- PENDING tasks by expiry: what the scheduler's TTL sweep looks for.
CREATE INDEX tasks_pending_expiry ON tasks (expires_at) WHERE status = 'PENDING';
