-- The SHA-256 of the request that created a task with an idempotency key (intake_svc/idempotency.py): a later
-- Submit with the same key and another fingerprint is refused (ALREADY_EXISTS), not taken for a retry.
-- NULL for tasks without a key and for rows written before this column existed (those match any request).
ALTER TABLE tasks ADD COLUMN fingerprint bytea;
