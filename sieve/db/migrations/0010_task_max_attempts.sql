-- A task's own limit of counted attempts (TaskSpec.max_attempts, 1 up to SIEVE_MAX_ATTEMPTS); NULL: the global
-- setting. The scheduler reads it where it decides to dead-letter (a counted put-back: nack, lease expiry,
-- execution timeout, worker gone).
ALTER TABLE tasks ADD COLUMN max_attempts smallint CHECK (max_attempts IS NULL OR max_attempts >= 1);
