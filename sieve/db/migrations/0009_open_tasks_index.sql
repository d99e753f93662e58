-- Reconciliation (scheduler_svc/reconcile.py) reads every open task in keyset pages ordered by (device, id): one
-- device's tasks come together, so each page needs one Redis call per device. The index holds open tasks only
-- (a task leaves it when it becomes final), so its size follows the backlog, not the table: a pass over a table
-- of millions of finished rows reads as many index entries as there are open tasks. It carries what a page needs
-- (lease, updated_at: the grace period, and whether the row changed since), so a page is an index-only scan in
-- key order: no heap fetch for an all-visible page, no sort, and no other index of open tasks can do it cheaper.
-- (Only updates that change lease or updated_at without changing status lose HOT for it; none do.)
--
-- The status list is literal, as in the query (sieve/db/tasks.py RECONCILE_PAGE_SQL), so that the planner can
-- prove the predicate for a generic plan too. On the table partitioned by id (0008) this is a partitioned index:
-- each partition gets its own, and a page is a merge of their ordered scans.
CREATE INDEX tasks_open_device_id ON tasks (device, id) INCLUDE (lease, updated_at)
    WHERE status IN ('PENDING', 'ASSIGNED', 'RUNNING');
