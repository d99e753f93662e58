-- Reconciliation (scheduler_svc/reconcile.py) reads every open task in keyset pages ordered by (device, id): one
-- device's tasks come together, so each page needs one Redis call per device. The index holds open tasks only
-- (a task leaves it when it becomes final), so its size follows the backlog, not the table: a pass over a table
-- of millions of finished rows reads as many index entries as there are open tasks.
--
-- The status list is literal, as in the query (TaskStore.reconcile_page), so that the planner can prove the
-- predicate even for a generic plan. On the table partitioned by id (0008) this is a partitioned index: each
-- partition gets its own, and a page is a merge of their ordered scans.
CREATE INDEX tasks_open_device_id ON tasks (device, id) WHERE status IN ('PENDING', 'ASSIGNED', 'RUNNING');
