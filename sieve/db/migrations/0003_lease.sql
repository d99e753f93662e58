-- The fencing token of a task's current hand-out (the scheduler's lease number, which never goes down).
-- `attempts` is what operators read: the attempt that counts towards dead-lettering.
ALTER TABLE tasks ADD COLUMN lease integer NOT NULL DEFAULT 0;
