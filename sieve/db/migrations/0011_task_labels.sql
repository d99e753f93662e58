-- A task's labels (TaskSpec.labels): the caller's business metadata (student_id, assignment_id, ...), a JSON
-- object of string values; NULL when the task has none. Stored with the task, returned by GetTask, sent with
-- its notifications.
ALTER TABLE tasks ADD COLUMN labels jsonb CHECK (labels IS NULL OR jsonb_typeof(labels) = 'object');
